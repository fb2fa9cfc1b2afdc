"""grpo_lab.tasks.arith (make arith-oneshot): the synthetic tasks SmolLM2 is trained on, offline and deterministic."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, compose_split, run_module

from grpo_lab.tasks import arith
from grpo_lab.tasks.rewards.strict_format import compute_score
from grpo_lab.verl_keys import get


def _cli(*args):
    return run_module("grpo_lab.tasks.arith", *args)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("arith") / "arith_oneshot"
    proc = _cli("--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def test_cli_writes_verl_rows(made):
    out, stdout = made
    assert "train 2048 rows, test 128 rows" in stdout
    assert "next: python run.py experiment=learn_smollm2" in stdout
    train = pq.read_table(out / "train.parquet").to_pylist()
    test = pq.read_table(out / "test.parquet").to_pylist()
    assert (len(train), len(test)) == (2048, 128)
    row = test[0]
    assert row["data_source"] == "arith_mixed_oneshot" and row["ability"] == "math"
    assert row["prompt"][0]["role"] == "user" and "#### 19" in row["prompt"][0]["content"]  # the one-shot example
    assert row["extra_info"]["question"] in row["prompt"][0]["content"]
    assert not {r["extra_info"]["question"] for r in train} & {r["extra_info"]["question"] for r in test}


def test_ground_truth_is_the_value_and_the_reference_scores_full(made):
    out, _ = made
    for row in pq.read_table(out / "test.parquet").to_pylist():
        ref = row["extra_info"]["answer"]
        expr, value = re.match(r"(.*) = (-?\d+)\n#### (-?\d+)$", ref).group(1, 2)
        assert eval(expr) == int(value) == int(row["reward_model"]["ground_truth"])  # noqa: S307 (our own digits)
        assert compute_score(row["data_source"], ref, row["reward_model"]["ground_truth"])["acc"] == 1.0


def test_deterministic_and_kept_when_up_to_date(made, tmp_path):
    out, _ = made
    again = tmp_path / "again"
    assert _cli("--out", str(again)).returncode == 0
    assert pq.read_table(again / "train.parquet").equals(pq.read_table(out / "train.parquet"))
    proc = _cli("--out", str(again))
    assert proc.returncode == 0 and proc.stdout.startswith("kept")


@pytest.mark.parametrize("task", arith.TASKS)
@pytest.mark.parametrize("style", arith.STYLES)
def test_every_task_and_style(task, style):
    rows = arith.rows(task, style, n_train=20, n_test=5, seed=3)
    assert len(rows["train"]) == 20 and rows["test"][0]["data_source"] == f"arith_{task}_{style}"
    for row in rows["test"]:
        expr = row["extra_info"]["answer"].split(" = ")[0]
        assert eval(expr) == int(row["reward_model"]["ground_truth"])  # noqa: S307


def test_bad_request_writes_nothing(tmp_path):
    out = tmp_path / "x"
    proc = _cli("--out", str(out), "--task", "sums", "--train-size", "20000")  # only 10000 distinct sums exist
    assert proc.returncode == 2 and "fewer than" in proc.stderr and not out.exists()
    proc = _cli("--out", str(out), "--test-size", "0")
    assert proc.returncode == 2 and "at least 1" in proc.stderr and not out.exists()


def test_dataset_option_points_at_the_made_files():
    verl, lab = compose_split("dataset=arith_oneshot")
    assert get(verl, "data.train_files") == str(ROOT / "data" / "arith_oneshot" / "train.parquet")
    assert lab.dataset.make == "make arith-oneshot"
