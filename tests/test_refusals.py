"""A refusal is a refusal: `make doctor`, `make report` and the sweep summary name the preflight's rules and fixes
for a job the preflight refused (through the real run.py, doctor and report entry points)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from conftest import ROOT, run_py

from grpo_lab.after_run import doctor
from grpo_lab.after_run import report as R
from grpo_lab.after_run import summary as S


@pytest.fixture(scope="module")
def refused_job(tmp_path_factory):
    job = tmp_path_factory.mktemp("refused") / "job"
    out = run_py("preflight.only=true", "ngpus_per_node=3", f"hydra.run.dir={job}")
    assert out.returncode == 2, out.stdout + out.stderr
    return job


def test_make_doctor_names_the_rules_and_their_fixes(refused_job):
    out = subprocess.run(["make", "--no-print-directory", "doctor", f"LOG={refused_job / 'train.log'}",
                          f"PY={sys.executable}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    # 3 GPUs: the mini-batch of 320 trajectories does not split (verl's V1 trainer pads the step, not the mini-batch)
    assert "[preflight_refused]" in text and "[mini_batch_divisibility]" in text
    assert "train_batch_size=126 ppo_mini_batch_size=63" in text
    # not the hang/NCCL guesses of a log that stops
    assert "NCCL_P2P_DISABLE" not in text and "num_cpus" not in text and "stopped before the first step" not in text


def test_make_report_on_a_refused_run(refused_job):
    rep = R.make_report(refused_job, plots=False, write=False)
    run = next(c for c in rep["checks"] if c["metric"] == "run")
    assert run["status"] == "bad" and "Refused by the preflight (mini_batch_divisibility)" in run["message"]
    assert [d["id"] for d in rep["diagnoses"]] == ["preflight_refused"]
    assert rep["diagnoses"][0]["overrides"] == ["train_batch_size=126", "ppo_mini_batch_size=63"]


def test_doctor_leaves_other_failures_alone(tmp_path):
    (tmp_path / "status.json").write_text(json.dumps({"status": "failed", "error": "RuntimeError: boom"}))
    (tmp_path / "plan.json").write_text(json.dumps({"errors": []}))
    assert doctor.refusal(tmp_path) is None


def test_sweep_summary_shows_a_refused_job_as_refused(tmp_path):
    sweep = tmp_path / "sweep"
    out = run_py("-m", "preflight.only=true", "ngpus_per_node=3,4", f"hydra.sweep.dir={sweep}")
    table = S.summarize_sweep(sweep, plots=False)
    rows = dict(zip(table["ngpus_per_node"].astype(str), table["status"]))
    assert rows["3"] == "refused: mini_batch_divisibility", (rows, out.stderr[-2000:])
    assert rows["4"] == "planned"  # preflight.only: a plan, not a run
    md = (sweep / "summary.md").read_text()
    assert "refused: mini_batch_divisibility" in md and "try: `train_batch_size=126 ppo_mini_batch_size=63`" in md
    # a refusal is no crash: no traceback, the sweep goes on to job1, and the command exits 2 naming the job
    assert "Traceback" not in out.stderr and "Error executing job" not in out.stderr
    assert out.returncode == 2 and "1 sweep job(s) refused" in out.stderr and str(sweep / "job0") in out.stderr


def test_report_does_not_rewrite_a_recorded_run_under_benchmarks():
    run = ROOT / "benchmarks" / "gpu" / "results" / "2026-12-02" / "smoke_tiny_runpy"
    before = {p.name: hashlib.sha1(p.read_bytes()).hexdigest() for p in run.rglob("*") if p.is_file()}
    out = subprocess.run(["make", "--no-print-directory", "report", f"RUN={run}", f"PY={sys.executable}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "nothing written: a recorded run outside outputs/" in out.stdout
    after = {p.name: hashlib.sha1(p.read_bytes()).hexdigest() for p in run.rglob("*") if p.is_file()}
    assert after == before
    assert not R.writes_allowed(run) and R.writes_allowed(ROOT / "outputs" / "runs" / "x")


def test_make_doctor_and_make_report_take_a_path_with_spaces(tmp_path):
    job = tmp_path / "my runs" / "job 1"
    assert run_py("preflight.only=true", "ngpus_per_node=3", f"hydra.run.dir={job}").returncode == 2
    for target, var, says in (("doctor", f"LOG={job / 'train.log'}", "[mini_batch_divisibility]"),
                              ("report", f"RUN={job}", "Refused by the preflight (mini_batch_divisibility)")):
        out = subprocess.run(["make", "--no-print-directory", target, var, f"PY={sys.executable}"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and says in out.stdout, (target, out.stdout[-2000:], out.stderr[-2000:])
