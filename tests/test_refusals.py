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
    verdicts = dict(zip(table["ngpus_per_node"].astype(str), table["verdict"]))
    assert verdicts == {"3": "refused", "4": "fits"}  # its memory fits, but the job was refused
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


def test_an_unwritable_outputs_folder_is_one_line(tmp_path):
    (tmp_path / "outputs").write_text("")  # not a folder (a read-only one too, but root writes anywhere)
    for args, where in ((["preflight.only=true"], "hydra.run.dir=/tmp/grpo-lab/run"),
                        (["-m", "preflight.only=true", "rollout_gpu_mem_util=0.3,0.4"], "hydra.sweep.dir=")):
        p = run_py(*args, cwd=tmp_path)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert f"grpo-lab: error: {tmp_path / 'outputs'} is not a folder" in p.stderr and where in p.stderr
    fix = p.stderr.split("write the run elsewhere: ")[1].split()
    assert fix[:3] == ["python", "run.py", "-m"]
    assert run_py(*fix[2:], cwd=tmp_path).returncode == 3  # planned, not ready here (the CPU test machine)


@pytest.mark.parametrize("typed,says,fixed", [
    (["actor_rollout_ref.model.override_config={attn_implementation: sdpa}"],
     "Hydra merges the dict into actor_rollout_ref.model.override_config, which has no attn_implementation",
     ["++actor_rollout_ref.model.override_config={attn_implementation: sdpa}"]),
    (["rollout_gpu_mem_util=0.3,0.4"], "rollout_gpu_mem_util=0.3,0.4 is a list of values, which only a sweep takes",
     ["-m", "rollout_gpu_mem_util=0.3,0.4"]),
])
def test_no_raw_hydra_error_and_the_fix_works_as_typed(tmp_path, typed, says, fixed):
    p = run_py(*typed, "preflight.only=true", f"hydra.run.dir={tmp_path}/a")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and says in p.stderr, p.stderr
    assert "HYDRA_FULL_ERROR" not in p.stderr
    ok = run_py(*fixed, "preflight.only=true", f"hydra.run.dir={tmp_path}/b", f"hydra.sweep.dir={tmp_path}/c")
    assert ok.returncode == 3, ok.stdout[-2000:] + ok.stderr[-2000:]


def test_make_fit_write_with_spaces_names_a_name_that_works(tmp_path):
    p = subprocess.run(["make", "--no-print-directory", "fit", f"PY={sys.executable}", "WRITE=my 4b run",
                        f"ARGS=hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "LexerNoViableAlt" not in p.stderr
    assert "preflight.fit_write='my 4b run': a name of letters, digits" in p.stderr and "WRITE=my_4b_run" in p.stderr
