"""Your own question/answer pairs (JSONL, CSV or parquet) to verl's parquet rows, the same row shape as the GSM8K prep.

`python -m grpo_lab.tasks.data own --help` prints HELP below: the input, the rows written, the split, duplicates.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab.tasks.splits import DataError, write_splits

# the description `python -m grpo_lab.tasks.data own --help` prints
HELP = """Your own question/answer pairs (JSONL, CSV or parquet) to verl's parquet rows, \
the same row shape as the GSM8K prep.

    python -m grpo_lab.tasks.data own --input my_qa.jsonl --out data/own_qa                    # 10% held out as test
    python -m grpo_lab.tasks.data own --input train.csv --test-input test.csv --out data/own_qa
    python -m grpo_lab.tasks.data own --input my_qa.jsonl --question-field problem --answer-field solution \\
        --instruction 'Let'"'"'s think step by step and output the final answer after "####".' \\
        --data-source openai/gsm8k --out data/own_qa

Input: `.jsonl` (one JSON object per line), `.csv` (a header row; UTF-8, a BOM is fine; else --encoding latin-1 or
the file's codec) or `.parquet` (a record per row). Each record needs a question field and an answer field (names set
by --question-field/--answer-field; other fields are kept in extra_info).
Output: OUT/{train,test}.parquet, one row per pair:

    data_source   --data-source (default "own_qa"): the key verl's reward picks its scorer by. verl's built-in
                  default_compute_score knows "openai/gsm8k" (numeric answers, "#### n" in the response) and a few
                  others; any other name needs a custom reward (verl's reward.custom_reward_function.* keys).
    prompt        [{"role": "user", "content": question, + " " + --instruction when given}]
    ability       --ability (default "qa")
    reward_model  {"style": "rule", "ground_truth": the answer as a string, stripped (4.0 -> "4"; for
                  openai/gsm8k a plain number as its scorer compares it: "1,000" -> "1000", text refused)}
    extra_info    {"split", "index", "question" (without the instruction), "answer", "source" (file:line)}

Without --test-input, --test-fraction of the pairs (default 0.1, at least one) is held out, chosen by a seeded shuffle
(--seed, default 0): the same input and seed give the same files. Exact duplicates (same question and answer) are
dropped with a warning (--keep-duplicates keeps them); a question that appears with two different answers, or in both
train and test, is warned about. Both files are written to temporary names and renamed only when both are complete,
so a bad input never leaves half-written or mixed outputs; existing outputs are kept unless --force is given.
"""

DEFAULT_SOURCE = "own_qa"
DEFAULT_ABILITY = "qa"
FORMATS = (".jsonl", ".csv", ".parquet")
TEST_FRACTION = 0.1  # held out as test without --test-input
# convert_own's keyword arguments, each the `own` subcommand's option of that name (add_arguments)
OPTIONS = ("test_input", "test_fraction", "seed", "question_field", "answer_field", "instruction", "data_source",
           "ability", "keep_duplicates", "force", "encoding")
# how many examples a warning lists
_SHOW = 3


@dataclass
class Pair:
    question: str
    answer: str
    source: str                     # file:line, for messages and extra_info
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    counts: dict[str, int]
    paths: dict[str, Path]
    warnings: list[str]


# ------------------------------------------------------------------------------------------------------- reading

def _decoded(path: Path, encoding: str | None) -> str:
    """The file's text; bytes it cannot decode are an error naming the line and --encoding."""
    data = path.read_bytes()
    try:
        return data.decode(encoding or "utf-8-sig")
    except LookupError:
        raise DataError(f"--encoding {encoding}: not an encoding Python knows (e.g. utf-8, latin-1, cp1252)") from None
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: byte {data[e.start:e.start + 1]!r} is not "
                        f"{encoding or 'UTF-8'} text; name the file's encoding, e.g. --encoding latin-1 "
                        f"(make own-data DATA_ARGS=\"--encoding latin-1\")") from None


def _records(path: Path, encoding: str | None = None) -> list[tuple[int, dict[str, Any]]]:
    """(line number, record) for each record of a .jsonl or .csv file."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"{path}: unknown format {suffix or '(no extension)'!r}; expected one of {', '.join(FORMATS)} "
                        f"(JSON lines, CSV with a header row, or a parquet table)")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    out: list[tuple[int, dict[str, Any]]] = []
    if suffix == ".parquet":  # a table of pairs; its rows are numbered from 1 in messages
        import pyarrow.parquet as pq

        try:
            out = list(enumerate(pq.read_table(path).to_pylist(), 1))
        except Exception as exc:
            raise DataError(f"{path}: not a parquet file pyarrow can read ({type(exc).__name__}: {exc})") from None
    elif suffix == ".jsonl":
        for lineno, line in enumerate(io.StringIO(_decoded(path, encoding)), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg}, column {exc.colno})") from None
            if not isinstance(rec, dict):
                raise DataError(f"{path}:{lineno}: a JSON {type(rec).__name__}, not an object with question and "
                                f"answer fields")
            out.append((lineno, rec))
    else:
        reader = csv.DictReader(io.StringIO(_decoded(path, encoding), newline=""))
        try:
            for rec in reader:
                if not any((v or "").strip() for k, v in rec.items() if k is not None):
                    continue  # a blank line
                if None in rec:
                    raise DataError(f"{path}:{reader.line_num}: more values than the header has columns "
                                    f"({len(reader.fieldnames or [])}); quote values that hold commas")
                out.append((reader.line_num, rec))
        except csv.Error as exc:
            raise DataError(f"{path}:{reader.line_num}: not valid CSV ({exc})") from None
    if not out:
        raise DataError(f"{path} holds no records (the file is empty"
                        f"{' or has only a header row' if suffix == '.csv' else ''})")
    return out


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # 4.0 -> "4", as a response writes the number
    return str(value).strip()


def gsm8k_truth(answer: str, where: str) -> str:
    """The answer as verl's GSM8K scorer can equal it: it compares the text after the response's last "#### " that
    matches -?[0-9.,]+, commas dropped, with the ground truth as a string."""
    text = answer.replace(",", "")
    if not re.fullmatch(r"-?\d+(\.\d+)?", text):
        raise DataError(f"{where}: answer {answer!r} is not a number, and verl's GSM8K scorer (data_source "
                        f"openai/gsm8k) only rewards a response whose \"#### n\" equals it as -?[0-9.]+ text; give a "
                        f"plain number, or another --data-source with a reward of your own")
    return re.sub(r"\.0+$", "", text)


def read_pairs(path: str | os.PathLike, question_field: str = "question", answer_field: str = "answer",
               encoding: str | None = None, data_source: str = DEFAULT_SOURCE) -> list[Pair]:
    """The question/answer pairs of one input file; a missing or empty field is an error naming the fields there."""
    path = Path(path)
    pairs = []
    for lineno, rec in _records(path, encoding):
        where = f"{path}:{lineno}"
        values = {}
        for role, name, flag in (("question", question_field, "--question-field"),
                                 ("answer", answer_field, "--answer-field")):
            if name not in rec:
                raise DataError(f"{where}: no {role} field {name!r}; the fields there are {sorted(rec)}. "
                                f"Name the {role} field with {flag} <one of them>")
            text = _text(rec[name])
            if text is None:
                kind = type(rec[name]).__name__ if rec[name] is not None else "null"
                raise DataError(f"{where}: the {role} field {name!r} is {kind}, not text or a number")
            if not text:
                raise DataError(f"{where}: the {role} field {name!r} is empty")
            values[role] = text
        if data_source == "openai/gsm8k":
            values["answer"] = gsm8k_truth(values["answer"], where)
        extra = {k: v for k, v in rec.items() if k not in (question_field, answer_field)}
        pairs.append(Pair(values["question"], values["answer"], where, extra))
    return pairs


# ------------------------------------------------------------------------------------------------------- checks

def _examples(items: list[str]) -> str:
    more = f" and {len(items) - _SHOW} more" if len(items) > _SHOW else ""
    return ", ".join(items[:_SHOW]) + more


def dedupe(pairs: list[Pair], keep: bool, warnings: list[str]) -> list[Pair]:
    """Drop exact duplicates (first kept) unless keep; warn about them and about questions with two answers."""
    seen: dict[tuple[str, str], Pair] = {}
    answers: dict[str, Pair] = {}
    dups, conflicts, out = [], [], []
    for p in pairs:
        key = (p.question, p.answer)
        if key in seen:
            dups.append(f"{p.source} (= {seen[key].source})")
            if not keep:
                continue
        else:
            seen[key] = p
            first = answers.setdefault(p.question, p)
            if first.answer != p.answer:
                conflicts.append(f"{p.source} ({p.answer!r} vs {first.answer!r} at {first.source})")
        out.append(p)
    if dups:
        what = "kept (--keep-duplicates)" if keep else "dropped, the first kept; --keep-duplicates keeps them"
        warnings.append(f"{len(dups)} duplicate pair(s) {what}: {_examples(dups)}")
    if conflicts:
        warnings.append(f"{len(conflicts)} question(s) appear with different answers (the reward cannot be right for "
                        f"both): {_examples(conflicts)}")
    return out


def split_pairs(pairs: list[Pair], test_fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(train, test): a seeded shuffle holds out round(n x fraction) pairs (at least one); order kept in each part."""
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"--test-fraction {test_fraction} is outside (0, 1); e.g. --test-fraction 0.1, or give the "
                        f"test pairs in their own file with --test-input")
    n = len(pairs)
    n_test = max(1, round(n * test_fraction))
    if n - n_test < 1:
        raise DataError(f"{n} pair(s) cannot be split into train and test at --test-fraction {test_fraction}: "
                        f"give at least 2, or a separate --test-input file")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    held = set(order[:n_test])
    return [p for i, p in enumerate(pairs) if i not in held], [p for i, p in enumerate(pairs) if i in held]


# ------------------------------------------------------------------------------------------------------- rows

def row(p: Pair, split: str, index: int, *, instruction: str | None, data_source: str, ability: str) -> dict:
    content = p.question + (" " + instruction.strip() if instruction and instruction.strip() else "")
    extra = {"split": split, "index": index, "question": p.question, "answer": p.answer, "source": p.source}
    # the input's other fields ride along as text (parquet needs one type per column)
    for k, v in p.extra.items():
        extra.setdefault(str(k), v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": p.answer},
        "extra_info": extra,
    }


def _uniform_extra(rows: list[dict]) -> None:
    """Every row's extra_info gets the same keys (parquet's struct column), missing ones as empty strings."""
    keys = dict.fromkeys(k for r in rows for k in r["extra_info"])
    for r in rows:
        r["extra_info"].update({k: "" for k in keys if k not in r["extra_info"]})


def convert_own(input_path: str | os.PathLike, out_dir: str | os.PathLike, *,
                test_input: str | os.PathLike | None = None, test_fraction: float = TEST_FRACTION, seed: int = 0,
                question_field: str = "question", answer_field: str = "answer", instruction: str | None = None,
                data_source: str = DEFAULT_SOURCE, ability: str = DEFAULT_ABILITY, keep_duplicates: bool = False,
                force: bool = False, encoding: str | None = None) -> Result:
    """Read, check, split and write OUT/{train,test}.parquet (both or neither). Raises DataError on bad input."""
    out_dir = Path(out_dir)
    targets = {s: out_dir / f"{s}.parquet" for s in ("train", "test")}
    existing = [str(t) for t in targets.values() if t.exists()]
    if existing and not force:
        raise DataError(f"{' and '.join(existing)} already exist(s); --force rewrites, or choose another --out")
    if not data_source.strip():
        raise DataError("--data-source is empty: give the name verl's reward selects the scorer by, e.g. own_qa")
    warnings: list[str] = []

    def read(path: str | os.PathLike) -> list[Pair]:
        return dedupe(read_pairs(path, question_field, answer_field, encoding, data_source), keep_duplicates, warnings)

    if test_input is None:
        train, test = split_pairs(read(input_path), test_fraction, seed)
    else:
        train, test = read(input_path), read(test_input)
    in_train = {p.question: p for p in train}
    leaked = [f"{p.source} (= {in_train[p.question].source})" for p in test if p.question in in_train]
    if leaked:
        warnings.append(f"{len(leaked)} test question(s) also in train (the test score overstates): "
                        f"{_examples(leaked)}")
    rows = {}
    for split, part in (("train", train), ("test", test)):
        rows[split] = [row(p, split, i, instruction=instruction, data_source=data_source, ability=ability)
                       for i, p in enumerate(part)]
        _uniform_extra(rows[split])
    paths = write_splits(rows, out_dir)
    return Result({s: len(r) for s, r in rows.items()}, paths, warnings)


def add_arguments(p: Any) -> None:
    """The `own` subcommand's options (grpo_lab.tasks.data's command line)."""
    p.add_argument("--input", required=True, help="your pairs: a .jsonl, .csv or .parquet file")
    p.add_argument("--out", default="data/own_qa",
                   help="output folder (default: data/own_qa, what dataset=own_qa reads)")
    p.add_argument("--test-input", default=None, help="test pairs in their own file (else --test-fraction of --input)")
    p.add_argument("--test-fraction", type=float, default=TEST_FRACTION,
                   help=f"share held out as test (default {TEST_FRACTION:g})")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/test shuffle (default 0)")
    p.add_argument("--question-field", default="question", help="the question's field or column (default: question)")
    p.add_argument("--answer-field", default="answer", help="the answer's field or column (default: answer)")
    p.add_argument("--instruction", default=None, help="text appended to each question after a space")
    p.add_argument("--data-source", default=DEFAULT_SOURCE,
                   help=f"the rows' data_source, which verl's reward dispatches on (default: {DEFAULT_SOURCE})")
    p.add_argument("--ability", default=DEFAULT_ABILITY, help=f"the rows' ability field (default: {DEFAULT_ABILITY})")
    p.add_argument("--keep-duplicates", action="store_true", help="keep exact duplicate pairs (default: drop them)")
    p.add_argument("--force", action="store_true", help="rewrite existing output files")
    p.add_argument("--encoding", default=None, help="the .jsonl/.csv text encoding (default: UTF-8), e.g. latin-1")


def run(args: Any) -> Result:
    """convert_own with the `own` subcommand's options."""
    return convert_own(args.input, args.out, **{k: getattr(args, k) for k in OPTIONS})


def scorer_note(data_source: str) -> str:
    if data_source == "openai/gsm8k":
        return ("data_source openai/gsm8k: verl's GSM8K scorer rewards 1.0 when the number after \"####\" in the "
                "response equals the answer; give numeric answers and an --instruction that asks for \"####\"")
    return (f"data_source {data_source!r}: verl's built-in scorer does not know it, so the run needs a custom reward "
            f"(verl's reward.custom_reward_function.path/name keys) that scores data_source {data_source!r}")

