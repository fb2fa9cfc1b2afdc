"""Your own question/answer pairs -> verl rows (grpo_lab/tasks/own_data.py through `python -m grpo_lab.tasks.data own`).

The input files are small ones each test writes; no downloads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, compose_split, planned, run_py

from grpo_lab.tasks import own_data
from grpo_lab.tasks.data import DataError

PAIRS = [
    {"problem": f"What is {a} + {b}?", "solution": a + b, "topic": "add"} for a, b in
    [(2, 3), (10, 7), (41, 1), (5, 5), (8, 13), (100, 23), (6, 9), (30, 12), (11, 11), (70, 4)]
]


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _cli(*args, cwd=ROOT):
    """python -m grpo_lab.tasks.data own ARGS, as a user types it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "grpo_lab.tasks.data", "own", *map(str, args)], cwd=cwd, env=env,
                          text=True, capture_output=True, timeout=120)


def _rows(path):
    return pq.read_table(path).to_pylist()


def test_jsonl_with_own_field_names_instruction_and_source(tmp_path):
    src = _jsonl(tmp_path / "qa.jsonl", PAIRS)
    out = tmp_path / "out"
    p = _cli("--input", src, "--out", out, "--question-field", "problem", "--answer-field", "solution",
             "--instruction", "Answer with a number only.", "--data-source", "my/arith", "--ability", "math")
    assert p.returncode == 0, p.stderr
    assert "train: 9 rows" in p.stdout and "test: 1 rows" in p.stdout
    assert "custom reward" in p.stdout  # my/arith is not a source verl's built-in scorer knows
    assert sorted(x.name for x in out.iterdir()) == ["test.parquet", "train.parquet"]  # no temporary files left
    train, test = _rows(out / "train.parquet"), _rows(out / "test.parquet")
    assert len(train) + len(test) == len(PAIRS)
    r = train[0]
    assert r["data_source"] == "my/arith" and r["ability"] == "math"
    assert r["prompt"] == [{"role": "user", "content": "What is 2 + 3? Answer with a number only."}]
    assert r["reward_model"] == {"style": "rule", "ground_truth": "5"}  # numbers become text, as verl's scorers take
    assert r["extra_info"] == {"split": "train", "index": 0, "question": "What is 2 + 3?", "answer": "5",
                               "source": f"{src}:1", "topic": "add"}
    assert [x["extra_info"]["index"] for x in train] == list(range(9))
    assert test[0]["extra_info"]["split"] == "test"
    # train and test together are the input, each pair once
    got = sorted(x["extra_info"]["question"] for x in train + test)
    assert got == sorted(p["problem"] for p in PAIRS)


def test_split_is_deterministic_and_seeded(tmp_path):
    src = _jsonl(tmp_path / "qa.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(50)])

    def test_questions(seed, out):
        own_data.convert_own(src, tmp_path / out, seed=seed, test_fraction=0.2)
        return [r["extra_info"]["question"] for r in _rows(tmp_path / out / "test.parquet")]

    a, b, c = test_questions(0, "a"), test_questions(0, "b"), test_questions(1, "c")
    assert a == b and len(a) == 10
    assert a != c
    # the same input and seed give the same files, row for row
    assert _rows(tmp_path / "a" / "train.parquet") == _rows(tmp_path / "b" / "train.parquet")


def test_csv_with_bom_quotes_and_a_test_file(tmp_path):
    train = tmp_path / "train.csv"
    train.write_text('\ufeffquestion,answer,notes\n"Add 1,000 and 1?",1001,"has, commas"\nHalf of 8?,4,\n\n',
                     encoding="utf-8")
    test = tmp_path / "test.csv"
    test.write_text("question,answer,notes\nDouble 21?,42,x\n", encoding="utf-8")
    res = own_data.convert_own(train, tmp_path / "out", test_input=test, data_source="openai/gsm8k")
    assert res.counts == {"train": 2, "test": 1} and res.warnings == []
    rows = _rows(tmp_path / "out" / "train.parquet")
    assert rows[0]["prompt"][0]["content"] == "Add 1,000 and 1?"  # no instruction: the question as it is
    assert rows[0]["reward_model"]["ground_truth"] == "1001" and rows[0]["extra_info"]["notes"] == "has, commas"
    assert rows[0]["extra_info"]["source"] == f"{train}:2"
    assert _rows(tmp_path / "out" / "test.parquet")[0]["reward_model"]["ground_truth"] == "42"
    # verl's own GSM8K scorer takes these rows when data_source is openai/gsm8k
    from verl.utils.reward_score import default_compute_score

    assert default_compute_score("openai/gsm8k", "so #### 1001", rows[0]["reward_model"]["ground_truth"]) == 1.0
    assert default_compute_score("openai/gsm8k", "so #### 1000", rows[0]["reward_model"]["ground_truth"]) == 0.0


def test_rows_load_in_verls_dataset(tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from grpo_lab.tasks.tiny import build_tokenizer, tokenizer_corpus

    src = _jsonl(tmp_path / "qa.jsonl", PAIRS)
    own_data.convert_own(src, tmp_path / "out", question_field="problem", answer_field="solution",
                         instruction="Answer with a number.")
    tok = build_tokenizer(tokenizer_corpus([{"question": p["problem"], "answer": str(p["solution"])} for p in PAIRS]),
                          2048)
    cfg = OmegaConf.create({"max_prompt_length": 256, "filter_overlong_prompts": True, "truncation": "error",
                            "cache_dir": str(tmp_path / "cache"), "filter_overlong_prompts_workers": 1,
                            "apply_chat_template_kwargs": {"enable_thinking": False}})
    ds = RLHFDataset([str(tmp_path / "out" / "train.parquet")], tok, cfg)
    assert len(ds) == 9
    item = ds[0]
    assert item["data_source"] == "own_qa" and item["raw_prompt"][0]["content"].endswith("Answer with a number.")
    assert item["reward_model"]["ground_truth"] == "5"


def test_missing_field_names_the_fields_there_and_writes_nothing(tmp_path):
    src = _jsonl(tmp_path / "qa.jsonl", PAIRS)
    p = _cli("--input", src, "--out", tmp_path / "out")  # default field names: question / answer
    assert p.returncode == 2
    assert f"{src}:1: no question field 'question'" in p.stderr
    assert "['problem', 'solution', 'topic']" in p.stderr and "--question-field" in p.stderr
    assert "nothing was written" in p.stderr
    assert not (tmp_path / "out").exists()


def test_a_bad_record_late_in_the_file_leaves_old_outputs_alone(tmp_path):
    out = tmp_path / "out"
    good = _jsonl(tmp_path / "good.jsonl", [{"question": f"q{i}", "answer": i} for i in range(5)])
    assert _cli("--input", good, "--out", out).returncode == 0
    before = {f: (out / f).read_bytes() for f in ("train.parquet", "test.parquet")}
    bad = _jsonl(tmp_path / "bad.jsonl", [{"question": f"n{i}", "answer": i} for i in range(5)] +
                 [{"question": "q", "answer": ""}])
    p = _cli("--input", bad, "--out", out, "--force")
    assert p.returncode == 2 and f"{bad}:6: the answer field 'answer' is empty" in p.stderr
    assert {f: (out / f).read_bytes() for f in before} == before
    assert sorted(x.name for x in out.iterdir()) == ["test.parquet", "train.parquet"]
    # and without --force, existing outputs are kept with a message that says how to rewrite them
    p = _cli("--input", good, "--out", out)
    assert p.returncode == 2 and "--force rewrites" in p.stderr


@pytest.mark.parametrize("name,text,message", [
    ("empty.jsonl", "", "holds no records (the file is empty)"),
    ("blank.jsonl", "\n\n", "holds no records"),
    ("header.csv", "question,answer\n", "or has only a header row"),
    ("broken.jsonl", '{"question": "a", "answer": 1}\n{"question": \n', "broken.jsonl:2: not valid JSON"),
    ("list.jsonl", '["a", 1]\n', "list.jsonl:1: a JSON list, not an object"),
    ("wide.csv", "question,answer\na,1,extra\n", "wide.csv:2: more values than the header has columns (2)"),
    ("nested.jsonl", '{"question": {"text": "a"}, "answer": 1}\n', "question field 'question' is dict"),
    ("data.txt", "question,answer\n", "unknown format '.txt'"),
])
def test_bad_inputs_get_clear_errors(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=None) as err:
        own_data.convert_own(path, tmp_path / "out")
    assert message in str(err.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_duplicates_conflicts_and_leaks_are_warned(tmp_path):
    recs = [{"question": "a", "answer": "1"}, {"question": "b", "answer": "2"}, {"question": "a", "answer": "1"},
            {"question": "b", "answer": "3"}, {"question": "c", "answer": "4"}]
    src = _jsonl(tmp_path / "qa.jsonl", recs)
    p = _cli("--input", src, "--out", tmp_path / "out", "--test-fraction", "0.25")
    assert p.returncode == 0, p.stderr
    assert f"1 duplicate pair(s) dropped, the first kept; --keep-duplicates keeps them: {src}:3 (= {src}:1)" in p.stderr
    assert "1 question(s) appear with different answers" in p.stderr and f"{src}:4 ('3' vs '2'" in p.stderr
    n = sum(len(_rows(tmp_path / "out" / f"{s}.parquet")) for s in ("train", "test"))
    assert n == 4
    kept = own_data.convert_own(src, tmp_path / "kept", keep_duplicates=True)
    assert sum(kept.counts.values()) == 5 and "kept (--keep-duplicates)" in kept.warnings[0]
    # a test question that is also a train question
    test = _jsonl(tmp_path / "test.jsonl", [{"question": "c", "answer": "4"}])
    res = own_data.convert_own(src, tmp_path / "leak", test_input=test)
    assert any("1 test question(s) also in train" in w for w in res.warnings)


def test_split_needs_two_pairs_and_a_sane_fraction(tmp_path):
    one = _jsonl(tmp_path / "one.jsonl", [{"question": "a", "answer": "1"}])
    with pytest.raises(DataError, match="1 pair\\(s\\) cannot be split .* --test-input"):
        own_data.convert_own(one, tmp_path / "o1")
    two = _jsonl(tmp_path / "two.jsonl", [{"question": "a", "answer": "1"}, {"question": "b", "answer": "2"}])
    with pytest.raises(DataError, match="--test-fraction 1.5 is outside"):
        own_data.convert_own(two, tmp_path / "o2", test_fraction=1.5)
    assert own_data.convert_own(two, tmp_path / "o3", test_fraction=0.01).counts == {"train": 1, "test": 1}


def test_dataset_option_reads_the_made_files_through_run_py(tmp_path):
    verl, lab = compose_split("dataset=own_qa")
    assert verl["data"]["train_files"].endswith("/data/own_qa/train.parquet")
    assert verl["data"]["val_files"].endswith("/data/own_qa/test.parquet")
    assert lab.dataset.make.startswith("python -m grpo_lab.tasks.data own")
    # before the files exist, the plan says how to make them
    p = run_py("dataset=own_qa", "model=qwen3_0_6b", "preflight.only=true", cwd=tmp_path)
    assert planned(p), p.stdout + p.stderr
    assert "python -m grpo_lab.tasks.data own --input" in p.stdout
    # make them in the folder run.py is started from: with the default data_source (own_qa) verl's own scorer has
    # nothing for the rows, and the preflight says so (rule reward_fn_data_source) ...
    src = _jsonl(tmp_path / "qa.jsonl", [{"question": f"What is {i} + {i}?", "answer": 2 * i} for i in range(400)])
    assert _cli("--input", src, "--out", "data/own_qa", cwd=tmp_path).returncode == 0
    p = run_py("dataset=own_qa", "model=qwen3_0_6b", "preflight.only=true", cwd=tmp_path)
    assert p.returncode != 0 and "[reward_fn_data_source] the data's data_source 'own_qa'" in p.stdout, p.stdout
    # ... with GSM8K's data_source (numeric answers) verl's scorer takes them, and the preflight counts their rows
    assert _cli("--input", src, "--out", "data/own_qa", "--data-source", "openai/gsm8k", "--force",
                cwd=tmp_path).returncode == 0
    p = run_py("dataset=own_qa", "model=qwen3_0_6b", "preflight.only=true", "preflight.verbose=true", cwd=tmp_path)
    assert planned(p), p.stdout + p.stderr
    assert "360 train rows / 128 = 2 steps per epoch" in p.stdout


def test_make_own_data(tmp_path):
    src = _jsonl(tmp_path / "qa.jsonl", PAIRS)
    out = tmp_path / "made"
    make = ["make", "-s", "-C", str(ROOT), "own-data", f"PY={sys.executable}"]
    p = subprocess.run(make + [f"IN={src}", f"OWN_OUT={out}",
                               "DATA_ARGS=--question-field problem --answer-field solution"],
                       text=True, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "train: 9 rows" in p.stdout and len(_rows(out / "train.parquet")) == 9
    p = subprocess.run(make, text=True, capture_output=True, timeout=60)
    assert p.returncode != 0 and "usage: make own-data IN=" in p.stdout


def test_latin1_csv_names_the_line_and_encoding_reads_it(tmp_path):
    src = tmp_path / "qa.csv"
    src.write_bytes("question,answer\nHalf of 8?,4\nCafé: 2+2?,4\n".encode("latin-1"))
    make = ["make", "-s", "-C", str(ROOT), "own-data", f"PY={sys.executable}", f"IN={src}", f"OWN_OUT={tmp_path / 'o'}"]
    p = subprocess.run(make, text=True, capture_output=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert f"{src}:3: byte b'\\xe9' is not UTF-8 text" in p.stderr and "--encoding latin-1" in p.stderr
    assert not (tmp_path / "o").exists()
    p = subprocess.run(make + ["DATA_ARGS=--encoding latin-1"], text=True, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = _rows(tmp_path / "o" / "train.parquet") + _rows(tmp_path / "o" / "test.parquet")
    assert "Café: 2+2?" in {r["extra_info"]["question"] for r in rows}


def test_gsm8k_ground_truth_is_what_its_scorer_matches(tmp_path):
    from verl.utils.reward_score import default_compute_score

    src = _jsonl(tmp_path / "qa.jsonl", [{"question": "a", "answer": 4.0}, {"question": "b", "answer": 4.5},
                                         {"question": "c", "answer": "1,000"}, {"question": "d", "answer": -3}])
    p = _cli("--input", src, "--out", tmp_path / "o", "--data-source", "openai/gsm8k", "--test-input", src)
    assert p.returncode == 0, p.stderr
    truths = [r["reward_model"]["ground_truth"] for r in _rows(tmp_path / "o" / "train.parquet")]
    assert truths == ["4", "4.5", "1000", "-3"]
    for response, truth in zip(["#### 4", "#### 4.5", "#### 1,000", "#### -3"], truths, strict=True):
        assert default_compute_score("openai/gsm8k", response, truth) == 1.0
    bad = _jsonl(tmp_path / "bad.jsonl", [{"question": "a", "answer": "4 apples"}])
    p = _cli("--input", bad, "--out", tmp_path / "b", "--data-source", "openai/gsm8k")
    assert p.returncode == 2 and f"{bad}:1: answer '4 apples' is not a number" in p.stderr and "GSM8K" in p.stderr
    assert not (tmp_path / "b").exists()
