"""Rule data_columns (grpo_lab/checks/rules/batch.py): the data files hold the columns the composed config reads, read
from the parquet schema; the command it prints writes files that pass, run as printed (run.py, make, python -m)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import composed, fresh_clone, run_py, write_rows

from grpo_lab.checks.preflight import run_preflight
from grpo_lab.memory.run import Run

N = 300  # rows: more than one train batch of any dataset option


def _errors(job) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in json.loads((job / "plan.json").read_text())["errors"]:
        out.setdefault(e["rule"], []).append(e)
    return out


def _command(fix: str) -> tuple[list[str], str]:
    """The command of a data_columns fix (between backticks) as words, and the overrides after `then:`."""
    cmd = fix.split("`")[1]
    then = fix.partition(", then: ")[2]
    return shlex.split(cmd), then


def test_files_without_the_columns_verl_reads_are_refused_and_the_printed_commands_make_good_ones(tmp_path):
    root = fresh_clone(tmp_path / "a clone")  # a path with a space, as the user's file below
    ours = root / "data" / "arith_oneshot"
    ours.mkdir(parents=True)
    pq.write_table(pa.table({"question": [f"What is {i} + 1?" for i in range(N)]}), ours / "train.parquet")
    mine = tmp_path / "my data" / "pairs.parquet"
    mine.parent.mkdir()
    pq.write_table(pa.table({"question": [f"What is {i} + 2?" for i in range(N)],
                             "answer": [str(i + 2) for i in range(N)]}), mine)
    args = ("dataset=arith_oneshot", f"test_file={mine}", "preflight.only=true")
    bad = run_py(*args, f"hydra.run.dir={tmp_path / 'bad'}", cwd=root, root=root)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    found = {e["message"].split(":")[0]: e for e in _errors(tmp_path / "bad")["data_columns"]}
    assert set(found) == {"data.train_files", "data.val_files"}, found
    for e in found.values():  # each column the composed config reads, and who reads it
        for col, who in (("prompt", "data.prompt_key"), ("data_source", "data.reward_fn_key"),
                         ("reward_model.ground_truth", "what reward_fn=verl_default")):
            assert f"no {col} ({who}" in e["message"] or f"no column {col} ({who}" in e["message"], e["message"]
    assert "its columns: question." in found["data.train_files"]["message"]
    assert "its columns: answer, question." in found["data.val_files"]["message"]
    assert f"[data_columns] data.val_files: {mine} has no column prompt" in bad.stdout  # the path whole, as typed

    # the generator's own file: that generator again, --force (make keeps files that are there)
    cmd, then = _command(found["data.train_files"]["fix"])
    assert cmd == ["python", "-m", "grpo_lab.tasks.arith", "--out", "data/arith_oneshot", "--force"] and not then
    made = subprocess.run([sys.executable, *cmd[1:]], cwd=root, text=True, capture_output=True, timeout=120)
    assert made.returncode == 0, made.stderr
    # the user's own pairs: make own-data from this very file, then the overrides that read what it wrote
    cmd, then = _command(found["data.val_files"]["fix"])
    assert cmd[:2] == ["make", "own-data"] and f"IN={mine}" in cmd, cmd
    assert then == "train_file=data/own_qa/train.parquet test_file=data/own_qa/test.parquet"
    made = subprocess.run([*cmd, f"PY={sys.executable}"], cwd=root, text=True, capture_output=True, timeout=120)
    assert made.returncode == 0 and (root / "data" / "own_qa" / "test.parquet").is_file(), made.stdout + made.stderr

    fixed = run_py(*args, f"hydra.run.dir={tmp_path / 'fixed'}", cwd=root, root=root)
    left = [e["message"].split(":")[0] for e in _errors(tmp_path / "fixed").get("data_columns", [])]
    assert left == ["data.val_files"], fixed.stdout  # the generator's file passes; the user's file is still theirs
    fixed = run_py(*args, *shlex.split(then), f"hydra.run.dir={tmp_path / 'then'}", cwd=root, root=root)
    assert "data_columns" not in _errors(tmp_path / "then"), fixed.stdout


def _check(tmp_path, *overrides, **columns):
    f = tmp_path / "rows.parquet"
    pq.write_table(pa.table(columns), f) if columns else write_rows(f, N)
    verl, lab = composed(*overrides)
    verl["data"]["train_files"] = verl["data"]["val_files"] = str(f)
    return [p for p in run_preflight(Run.build(verl, lab, {}), launching=False).errors if p.rule == "data_columns"]


def test_what_is_needed_follows_the_composed_config(tmp_path):
    assert _check(tmp_path) == []  # verl's row format (tests/conftest.py write_rows)
    # the prompt key the config names: a file that has verl's default column gets the override back to it
    (p, _) = _check(tmp_path, "data.prompt_key=question")
    assert "no column question (data.prompt_key" in p.message and p.alternatives[0] == "data.prompt_key=prompt"
    assert "re-checked" in p.checked
    # what the reward needs: a reward model scores without a ground truth, the rule scorers need one
    rows = {"prompt": [[{"role": "user", "content": "1+1?"}]] * N, "data_source": ["openai/gsm8k"] * N}
    (p, _) = _check(tmp_path, "reward_fn=strict_format", **rows)
    assert "no column reward_model.ground_truth (what reward_fn=strict_format scores" in p.message
    assert "data_source" not in p.message.split(";")[0].split("ground_truth")[0]
    assert _check(tmp_path, "reward.reward_model.enable=true", **rows) == []
    # a struct without the field is as good as no column
    (p, _) = _check(tmp_path, **rows, reward_model=[{"style": "rule"}] * N)
    assert "no column reward_model.ground_truth" in p.message
