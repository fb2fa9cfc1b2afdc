"""make plan's console (grpo_lab/checks/plan_text.py), through run.py as a user types it: an OK plan in at most 25 lines
with its verdict and next command; preflight.verbose=true adds all of plan.json's report; a sweep of plans, one line a
job."""

from __future__ import annotations

import json

from conftest import fake_gpus, model_folder, planned, run_py, write_rows

from grpo_lab.checks.plan_text import OK_LINES


def _ready_here(tmp_path) -> tuple[list[str], dict[str, str]]:
    """smoke_tiny on one (faked) GPU with its files here: a plan that can start on this machine."""
    train, test = write_rows(tmp_path / "train.parquet", 64), write_rows(tmp_path / "test.parquet", 8)
    return ([f"train_file={train}", f"test_file={test}", f"model_path={model_folder(tmp_path / 'model')}",
             "experiment=smoke_tiny", "hardware=h200x1", "preflight.only=true"], fake_gpus(tmp_path))


def test_an_ok_plan_fits_25_lines_with_its_verdict_and_next_command(tmp_path):
    args, env = _ready_here(tmp_path)
    proc = run_py(*args, f"hydra.run.dir={tmp_path / 'run'}", env=env)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and planned(proc), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(lines) <= OK_LINES, proc.stdout
    assert "preflight: OK" in lines and lines[-1].startswith("next: python run.py train_file=")
    assert "experiment=smoke_tiny" in lines[-1] and "preflight.only" not in lines[-1]
    for shown in ("Memory plan per GPU (", "  generation ", "  training ", "  weight sync ", "  host RAM ",
                  "Time plan (", "  run: "):
        assert any(line.startswith(shown) for line in lines), (shown, proc.stdout)
    assert "Batch arithmetic" not in proc.stdout and "differ from verl's defaults" not in proc.stdout


def test_verbose_adds_the_batch_arithmetic_and_the_rest_of_plan_json(tmp_path):
    args, env = _ready_here(tmp_path)
    proc = run_py(*args, "preflight.verbose=true", f"hydra.run.dir={tmp_path / 'run'}", env=env)
    assert proc.returncode == 0 and planned(proc), proc.stdout[-3000:] + proc.stderr[-3000:]
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    b = plan["batch"]
    assert "Batch arithmetic" in proc.stdout
    assert (f"{b['train_batch_size']} prompts x {b['rollout_n']} answers = {b['trajectories_per_step']} trajectories "
            "per step") in proc.stdout
    assert f"{len(plan['changed_defaults'])} value(s) differ from verl's defaults" in proc.stdout
    assert "actor state " in proc.stdout and "  assumed: " in proc.stdout and "\nNotes\n" in proc.stdout
    assert len(proc.stdout.splitlines()) > OK_LINES and "next: python run.py" in proc.stdout


def test_a_refused_plan_prints_its_errors_with_fixes_and_the_phases(tmp_path):
    proc = run_py("model=qwen3_4b", "hardware=rtx4080_16gbx4", "preflight.only=true", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2 and "\npreflight: REFUSED (5 error(s))" in proc.stdout, proc.stdout[-3000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    for e in plan["errors"]:
        assert f"  [{e['rule']}] {e['message']}" in proc.stdout and f"fix: {e['fix']}" in proc.stdout
    assert "  training        24.17 GB  oom" in proc.stdout and "make fit ARGS=" in proc.stdout


def test_a_sweep_of_plans_prints_one_line_a_job_and_the_summary(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_py("-m", "experiment=smoke", "rollout_gpu_mem_util=0.3,0.4,0.5", "preflight.only=true",
                  f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    ours = [line for line in proc.stdout.splitlines() if line.startswith("grpo-lab ")]
    assert [line.split(":")[0] for line in ours] == ["grpo-lab job0", "grpo-lab job1", "grpo-lab job2"], proc.stdout
    for n, line in enumerate(ours):
        assert "plan OK; not ready to launch here" in line and line.endswith(f"{sweep}/job{n}/plan.json"), line
    assert "preflight:" not in proc.stdout and "Memory plan" not in proc.stdout
    assert f"sweep summary in {sweep}/summary.md" in proc.stdout + proc.stderr
