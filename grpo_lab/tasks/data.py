"""GSM8K to verl's parquet row format (the rows verl's examples/data_preprocess/gsm8k.py writes).

    python -m grpo_lab.tasks.data gsm8k --out data/gsm8k                     # from the hub: openai/gsm8k, config "main"
    python -m grpo_lab.tasks.data gsm8k --out data/gsm8k --local-dir DIR     # offline, from files you already have
    python -m grpo_lab.tasks.data own --input my_qa.jsonl --out data/own_qa  # your own pairs: see
                                                                             # grpo_lab/tasks/own_data.py

What --local-dir reads and the rows written: docs/tasks.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import operator
import os
import random
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from grpo_lab.tasks.splits import DataError, stamp_holds, write_splits

DATA_SOURCE = "openai/gsm8k"
HUB_ID = "openai/gsm8k"
HUB_CONFIG = "main"
ABILITY = "math"
# verbatim from verl's examples/data_preprocess/gsm8k.py
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
# the same pattern verl's example and verl's scorer (verl/utils/reward_score/gsm8k.py, strict mode) use
_SOLUTION_RE = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_solution(answer: str) -> str:
    """The number after "####" in a GSM8K reference answer, commas removed (as verl's example does)."""
    match = _SOLUTION_RE.search(answer)
    if match is None:
        raise DataError(f'no "#### <number>" in the answer: {answer[-120:]!r}')
    return match.group(1).replace(",", "")


def gsm8k_row(question: str, answer: str, split: str, index: int, data_source: str = DATA_SOURCE,
              prompt: str | None = None) -> dict:
    """One verl row for a GSM8K-format record (question, reference answer ending in "#### n"); prompt: the user's
    message, when not the question and GSM8K's instruction."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": prompt or question + " " + INSTRUCTION}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": extract_solution(answer)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def to_rows(records: Iterable[Mapping], split: str) -> list[dict]:
    """verl rows for GSM8K-format records (mappings with `question` and `answer`), indexed from 0 in order."""
    rows = []
    for index, record in enumerate(records):
        try:
            question, answer = record["question"], record["answer"]
        except KeyError as exc:
            raise DataError(f"{split} record {index} has no {exc.args[0]!r} field (fields: {sorted(record)})") from None
        try:
            rows.append(gsm8k_row(str(question), str(answer), split, index))
        except DataError as exc:
            raise DataError(f"{split} record {index}: {exc}") from None
    return rows


QUESTION = operator.itemgetter("question")  # what makes a generated GSM8K-format record distinct


def gsm8k_record(question: str, expr: str, value: int) -> dict:
    """A generated problem as a GSM8K record: {question, answer "23 + 48 = 71\\n#### 71"}."""
    return {"question": question, "answer": f"{expr} = {value}\n#### {value}"}


def distinct(draw, n: int, rng: random.Random, key, exclude=frozenset(), too_few: str = "") -> list[dict]:
    """n records draw(rng) makes whose key(record) differ and are not in exclude; ValueError(too_few) when 100 x n
    draws do not find them."""
    seen, out = set(exclude), []
    for _ in range(100 * n):
        if len(out) == n:
            break
        record = draw(rng)
        if key(record) not in seen:
            seen.add(key(record))
            out.append(record)
    if len(out) < n:
        raise ValueError(too_few)
    return out


def cli_build(parser: argparse.ArgumentParser, argv: list[str] | None, train: tuple[str, ...], test: tuple[str, ...],
              sizes: tuple[int, int], make, next_hint: str) -> int:
    """A generator's command line (grpo_lab.tasks.arith, grpo_lab.tasks.countdown) after its own options: the train
    and test sizes (train_size, test_size; below 1 a usage error), --seed and --force; then make(args). A bad request
    (ValueError) is one line on stderr and exit 2, else the next command to type and 0."""
    parser.add_argument(*train, dest="train_size", type=int, default=sizes[0])
    parser.add_argument(*test, dest="test_size", type=int, default=sizes[1])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even when the files are up to date")
    args = parser.parse_args(argv)
    if args.train_size < 1 or args.test_size < 1:
        parser.error(f"{train[0]} and {test[0]} must be at least 1 (got {args.train_size}, {args.test_size})")
    try:
        make(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(next_hint)
    return 0


def build_once(out_dir: str | os.PathLike, stamp: str, settings: dict, build, force: bool, what: str) -> Path:
    """A generated dataset (tasks.arith, tasks.countdown): kept when OUT/stamp records the same settings (and not
    force), else build() -> {split: rows} (before anything is written: a bad request leaves no files), the splits,
    then the stamp; `what` ends the line that says so. Returns out_dir."""
    out_dir = Path(out_dir)
    if not force and stamp_holds(out_dir, stamp, settings):
        print(f"kept  {out_dir}/ (same settings; --force rebuilds)")
        return out_dir
    rows = build()
    write_splits(rows, out_dir)
    (out_dir / stamp).write_text(json.dumps(settings, indent=2) + "\n")
    print(f"wrote {out_dir}/: train {len(rows['train'])} rows, test {len(rows['test'])} rows ({what})")
    return out_dir


# ---------------------------------------------------------------------------------------------------- reading GSM8K

def _read_jsonl(path: str) -> list[dict]:
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return records


def _read_parquets(paths: list[str]) -> list[dict]:
    import pyarrow.parquet as pq

    records: list[dict] = []
    for path in paths:
        table = pq.read_table(path)
        if "question" not in table.column_names and "prompt" in table.column_names:
            raise DataError(f"{path} is already in verl's row format (it has `prompt`, not `question`/`answer`): "
                            "use it directly as a data file instead of converting it")
        records.extend(table.to_pylist())
    return records


def local_files(local_dir: str | os.PathLike, split: str) -> list[str]:
    """The GSM8K files for a split in DIR: {split}.jsonl, or {split}-*.parquet (also under main/), in that order."""
    local_dir = str(local_dir)
    for pattern in (f"{split}.jsonl", f"{split}-*.parquet", os.path.join("main", f"{split}-*.parquet")):
        found = sorted(glob.glob(os.path.join(local_dir, pattern)))
        if found:
            return found
    return []


def load_local(local_dir: str | os.PathLike) -> dict[str, list[dict]]:
    """GSM8K records {split: [{question, answer, ...}]} from local files (see the module docstring)."""
    if not os.path.isdir(local_dir):
        raise DataError(f"--local-dir {local_dir}: no such folder")
    out: dict[str, list[dict]] = {}
    for split in SPLITS:
        files = local_files(local_dir, split)
        if not files:
            raise DataError(
                f"no {split} files in {local_dir}: expected {split}.jsonl (GSM8K's GitHub release, "
                f"grade_school_math/data/) or {split}-*.parquet (the hub's openai/gsm8k, folder main/). "
                "Without --local-dir the data comes from the Hugging Face hub.")
        out[split] = _read_jsonl(files[0]) if files[0].endswith(".jsonl") else _read_parquets(files)
        if not out[split]:
            raise DataError(f"{files[0]} holds no records")
    return out


def load_hub() -> dict[str, list[dict]]:
    """GSM8K records from the Hugging Face hub (openai/gsm8k, config main), as verl's example loads them."""
    import datasets

    try:
        ds = datasets.load_dataset(HUB_ID, HUB_CONFIG)
    except Exception as exc:  # network, auth, cache: all end the same way for the user
        raise DataError(f"could not load {HUB_ID} ({HUB_CONFIG}) from the hub: {type(exc).__name__}: {exc}\n"
                        "Offline? Download GSM8K's train/test files elsewhere and pass --local-dir DIR.") from None
    return {split: ds[split].to_list() for split in SPLITS}


def convert_gsm8k(out_dir: str | os.PathLike, local_dir: str | os.PathLike | None = None,
                  force: bool = False) -> dict[str, int] | None:
    """Write OUT/{train,test}.parquet; returns {split: rows}, or None when both exist and force is False."""
    out_dir = Path(out_dir)
    targets = [out_dir / f"{split}.parquet" for split in SPLITS]
    if not force and all(t.is_file() for t in targets):
        return None
    records = load_local(local_dir) if local_dir is not None else load_hub()
    rows = {split: to_rows(records[split], split) for split in SPLITS}
    write_splits(rows, out_dir)
    return {split: len(r) for split, r in rows.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.tasks.data", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="dataset", required=True)
    g = sub.add_parser("gsm8k", help="GSM8K -> OUT/{train,test}.parquet in verl's row format")
    g.add_argument("--out", default="data/gsm8k", help="output folder (default: data/gsm8k)")
    g.add_argument("--local-dir", default=None,
                   help="read train/test from this folder (train.jsonl/test.jsonl or train-*.parquet/test-*.parquet) "
                        "instead of the hub")
    g.add_argument("--force", action="store_true", help="rewrite the output files when they already exist")
    from grpo_lab.tasks import own_data

    o = sub.add_parser("own", help="your own question/answer pairs (.jsonl or .csv) -> OUT/{train,test}.parquet",
                       description=own_data.HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    own_data.add_arguments(o)
    args = parser.parse_args(argv)
    if args.dataset == "own":
        try:
            result = own_data.run(args)
        except own_data.DataError as exc:  # grpo_lab.tasks.data's class, also when this file runs as __main__
            print(f"error: {exc}", file=sys.stderr)
            print("nothing was written", file=sys.stderr)
            return 2
        for w in result.warnings:
            print(f"warning: {w}", file=sys.stderr)
        for split, n in result.counts.items():
            print(f"{split}: {n} rows -> {result.paths[split]}")
        print(f"note: {own_data.scorer_note(args.data_source)}")
        return 0

    try:
        counts = convert_gsm8k(args.out, args.local_dir, args.force)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if counts is None:
        print(f"{args.out}/train.parquet and test.parquet exist; nothing to do (--force rewrites them)")
        return 0
    source = args.local_dir or f"hub {HUB_ID}"
    for split, n in counts.items():
        print(f"{split}: {n} rows -> {Path(args.out) / f'{split}.parquet'}  (from {source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
