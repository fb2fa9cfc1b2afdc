"""GSM8K -> verl rows (grpo_lab.tasks.data): verl's RLHFDataset loads them and verl's gsm8k scorer scores them right."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_lab.tasks import data

INSTR = 'Let\'s think step by step and output the final answer after "####".'
RECORDS = {
    "train": [
        {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                     "How many clips did Natalia sell altogether in April and May?",
         "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
                   "altogether in April and May.\n#### 72"},
        {"question": "A shop sells 1,000 pens a day for 2 days. How many pens?",
         "answer": "1,000 * 2 = <<1000*2=2000>>2,000\n#### 2,000"},
        {"question": "It is 3 degrees and gets 5 degrees colder. What is the temperature?",
         "answer": "3 - 5 = -2\n#### -2"},
    ],
    "test": [
        {"question": "Janet has 16 eggs and eats 3. How many are left?", "answer": "16 - 3 = 13\n#### 13"},
        {"question": "What is 23 + 48?", "answer": "23 + 48 = 71\n#### 71"},
    ],
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def _write_jsonl(folder, records=RECORDS):
    folder.mkdir(parents=True, exist_ok=True)
    for split, recs in records.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return folder


def test_row_format_is_verls_gsm8k_example():
    row = data.gsm8k_row(RECORDS["train"][0]["question"], RECORDS["train"][0]["answer"], "train", 0)
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": RECORDS["train"][0]["question"] + " " + INSTR}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {"split": "train", "index": 0, "answer": RECORDS["train"][0]["answer"],
                       "question": RECORDS["train"][0]["question"]},
    }
    assert [r["reward_model"]["ground_truth"] for r in data.to_rows(RECORDS["train"], "train")] == ["72", "2000", "-2"]


def test_cli_local_jsonl_rows_load_in_rlhfdataset_and_score(tmp_path, capsys):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.reward_score import default_compute_score
    from verl.utils.reward_score.gsm8k import compute_score

    from grpo_lab.tasks.tiny import build_tokenizer, tokenizer_corpus

    src = _write_jsonl(tmp_path / "src")
    out = tmp_path / "gsm8k"
    assert data.main(["gsm8k", "--out", str(out), "--local-dir", str(src)]) == 0
    printed = capsys.readouterr().out
    assert "train: 3 rows" in printed and "test: 2 rows" in printed
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]  # no temporary files left

    tokenizer = build_tokenizer(tokenizer_corpus(RECORDS["train"] + RECORDS["test"]), 4096)
    cfg = OmegaConf.create({"max_prompt_length": 256, "filter_overlong_prompts": True, "truncation": "error",
                            "cache_dir": str(tmp_path / "cache"), "filter_overlong_prompts_workers": 1,
                            "apply_chat_template_kwargs": {"enable_thinking": False}})
    ds = RLHFDataset([str(out / "train.parquet"), str(out / "test.parquet")], tokenizer, cfg)
    assert len(ds) == 5  # none filtered: every prompt went through the chat template
    item = ds[4]
    assert item["data_source"] == "openai/gsm8k"
    assert item["raw_prompt"] == [{"role": "user", "content": "What is 23 + 48? " + INSTR}]
    truth = item["reward_model"]["ground_truth"]
    assert truth == "71" and item["index"] == 1 and item["extra_info"]["split"] == "test"

    right, wrong = "23 + 48 = 71\n#### 71", "23 + 48 = 72\n#### 72"
    assert compute_score(right, truth) == 1.0
    assert compute_score(wrong, truth) == 0.0
    assert compute_score("the answer is 71", truth) == 0.0  # strict: no "#### n", no reward
    assert default_compute_score("openai/gsm8k", right, truth) == 1.0
    assert default_compute_score("openai/gsm8k", wrong, truth) == 0.0
    # commas in the reference are removed, as the scorer removes them from the response
    assert default_compute_score("openai/gsm8k", "#### 2,000", ds[1]["reward_model"]["ground_truth"]) == 1.0

    # a prompt longer than max_prompt_length is dropped by verl: the chat template really ran on our rows
    lengths = [len(tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                                 enable_thinking=False)["input_ids"])
               for r in pq.read_table(out / "test.parquet").to_pylist()]
    assert lengths[0] != lengths[1]
    short = OmegaConf.merge(cfg, {"max_prompt_length": min(lengths)})
    assert len(RLHFDataset(str(out / "test.parquet"), tokenizer, short)) == 1


def test_local_hub_parquet_layout(tmp_path):
    src = tmp_path / "hub" / "main"
    src.mkdir(parents=True)
    for split, recs in RECORDS.items():
        pq.write_table(pa.Table.from_pylist(recs), src / f"{split}-00000-of-00001.parquet")
    counts = data.convert_gsm8k(tmp_path / "out", local_dir=tmp_path / "hub")
    assert counts == {"train": 3, "test": 2}
    rows = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert rows[0]["prompt"][0]["content"].endswith(INSTR)
    assert rows[2]["extra_info"] == {"split": "train", "index": 2, "answer": RECORDS["train"][2]["answer"],
                                     "question": RECORDS["train"][2]["question"]}


def test_hub_loader_is_called_as_verls_example(tmp_path, monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append(args)
        return datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in RECORDS.items()})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert data.main(["gsm8k", "--out", str(tmp_path / "g")]) == 0
    assert calls == [("openai/gsm8k", "main")]
    assert pq.read_table(tmp_path / "g" / "test.parquet").num_rows == 2

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(data.DataError, match="--local-dir"):
        data.convert_gsm8k(tmp_path / "h")


def test_existing_output_is_kept_unless_force(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "src")
    out = tmp_path / "out"
    assert data.main(["gsm8k", "--out", str(out), "--local-dir", str(src)]) == 0
    before = (out / "train.parquet").stat().st_mtime_ns
    capsys.readouterr()
    assert data.main(["gsm8k", "--out", str(out), "--local-dir", str(src)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert (out / "train.parquet").stat().st_mtime_ns == before
    _write_jsonl(src, {"train": RECORDS["train"][:1], "test": RECORDS["test"]})
    assert data.main(["gsm8k", "--out", str(out), "--local-dir", str(src), "--force"]) == 0
    assert pq.read_table(out / "train.parquet").num_rows == 1


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "no such folder"),
    (lambda d: (d.mkdir(), (d / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')),
     "no test files in .*test.jsonl"),
    (lambda d: _write_jsonl(d, {"train": [{"question": "q", "answer": "no number"}], "test": RECORDS["test"]}),
     'train record 0: no "#### <number>"'),
    (lambda d: _write_jsonl(d, {"train": [{"q": "x", "answer": "#### 1"}], "test": RECORDS["test"]}),
     "train record 0 has no 'question' field"),
    (lambda d: (d.mkdir(), (d / "train.jsonl").write_text("{oops\n"), (d / "test.jsonl").write_text("")),
     r"train.jsonl:1: not valid JSON"),
])
def test_bad_input_gets_a_clear_error(tmp_path, capsys, setup, message):
    src = tmp_path / "src"
    setup(src)
    assert data.main(["gsm8k", "--out", str(tmp_path / "out"), "--local-dir", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_already_converted_parquet_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for split in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(data.to_rows(RECORDS[split], split)), src / f"{split}-0.parquet")
    with pytest.raises(data.DataError, match="already in verl's row format"):
        data.load_local(src)


def test_failed_write_leaves_old_outputs_and_no_partial_files(tmp_path, monkeypatch):
    src = _write_jsonl(tmp_path / "src")
    out = tmp_path / "out"
    data.convert_gsm8k(out, local_dir=src)
    old = {p.name: p.read_bytes() for p in out.iterdir()}

    real_write = pq.write_table
    calls = []

    def failing_write(table, where, *args, **kwargs):
        calls.append(where)
        if len(calls) == 2:  # the test split: the train file is already written (under its temporary name)
            raise OSError("disk full")
        return real_write(table, where, *args, **kwargs)

    monkeypatch.setattr(pq, "write_table", failing_write)
    _write_jsonl(src, {"train": RECORDS["train"][:1], "test": RECORDS["test"][:1]})
    with pytest.raises(OSError, match="disk full"):
        data.convert_gsm8k(out, local_dir=src, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == old
