"""benchmarks/gpu/speed_pair.py, as run on the recorded SmolLM2 pair of 2026-12-04 (results/2026-12-04-speed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu" / "speed_pair.py"
RESULTS = ROOT / "benchmarks" / "gpu" / "results" / "2026-12-04-speed"


def _steps(run: str, metric: str) -> list[float]:
    rows = [json.loads(line)["data"] for line in (RESULTS / run / "metrics.jsonl").read_text().splitlines()]
    return [d[metric] for d in rows if metric in d]


def test_the_pair_prints_steady_phases_their_ratio_curves_and_memory(tmp_path):
    out = tmp_path / "pair.json"
    p = subprocess.run([sys.executable, str(SCRIPT), str(RESULTS / "smol_guide"), str(RESULTS / "smol_fast"),
                        "--json", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    guide, fast = (_steps(r, "timing_s/step") for r in ("smol_guide", "smol_fast"))
    step = res["phases_s"]["step"]
    assert abs(step["guide_s"] - sum(guide[1:]) / len(guide[1:])) < 1e-9 and abs(step["ratio"] - 49.16 / 50.51) < 0.01
    assert "step                  49.16    50.51       0.97x" in p.stdout
    # the first steps side by side: every step of both runs
    assert [r["step"] for r in res["curves"]["actor/pg_loss"]] == [1, 2, 3, 4]
    assert res["curves"]["critic/score/mean"][0]["guide"] == _steps("smol_guide", "critic/score/mean")[0]
    # the validation accuracy at each step both validated, step 0 included, read from each run's file
    val = res["validation"]
    assert val["metric"] == "val-core/arith_mixed_oneshot/acc/mean@1"
    acc = {r: _steps(r, val["metric"]) for r in ("smol_guide", "smol_fast")}
    assert [(v["step"], v["guide"], v["fast"]) for v in val["rows"]] == [
        (0, acc["smol_guide"][0], acc["smol_fast"][0]), (4, acc["smol_guide"][1], acc["smol_fast"][1])]
    assert f"0: {acc['smol_guide'][0]:.3f} | {acc['smol_fast'][0]:.3f}, 4: " in p.stdout
    # each run against its own plan: checkpointing off was 0.61 of its plan (fixed since: memplan_calibration.md)
    assert res["memory"]["guide"]["status"] == "ok" and res["memory"]["fast"]["status"] == "warn"
    assert "plan / allocated 0.61" in p.stdout


def test_a_run_of_one_step_has_no_steady_step_and_is_refused(tmp_path):
    one = tmp_path / "one_step"
    shutil.copytree(RESULTS / "smol_guide", one, ignore=shutil.ignore_patterns("train.log*"))
    lines = (one / "metrics.jsonl").read_text().splitlines()
    (one / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")  # validation at step 0, then step 1
    p = subprocess.run([sys.executable, str(SCRIPT), str(one), str(RESULTS / "smol_fast")], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 1 and "fewer than 2 trained steps" in p.stderr and str(one) in p.stderr


PRESET = ROOT / "benchmarks" / "gpu" / "results"


def test_step_1_against_step_1_when_the_guide_stopped_after_its_first(tmp_path):
    guide, fit = PRESET / "2026-12-06-h100-preset-guide" / "p17_guide", PRESET / "2026-12-06-h100-preset" / "p17_fit"
    out = tmp_path / "pair.json"
    p = subprocess.run([sys.executable, str(SCRIPT), str(guide), str(fit), "--step", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    rows = [json.loads(line)["data"] for line in (guide / "metrics.jsonl").read_text().splitlines()]
    assert res["step"] == 1 and res["phases_s"]["step"]["guide_s"] == rows[0]["timing_s/step"]
    assert "step                 502.20   187.84       2.67x" in p.stdout and p.stdout.count("step 1 ") == 1
    # a step one of the runs does not have is named, with the steps it has
    p = subprocess.run([sys.executable, str(SCRIPT), str(guide), str(fit), "--step", "2"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 1 and "has no trained step 2" in p.stderr and "(its steps: 1)" in p.stderr


def test_runs_of_different_lengths_are_compared_over_the_steps_both_trained(tmp_path):
    """The README's 20-step run against the default's 10 steps: steps 2-10 of each (answers shorten as a model learns,
    so the longer run's later steps would make its mean shorter)."""
    guide = PRESET / "2026-12-03-smollm2-recheck" / "learn"
    fast = PRESET / "2026-12-06-h200-smol-default" / "smol_default"
    out = tmp_path / "pair.json"
    p = subprocess.run([sys.executable, str(SCRIPT), str(guide), str(fast), "--json", str(out)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    steps = {}
    for run in (guide, fast):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steps[run] = {r["step"]: r["data"]["timing_s/step"] for r in rows if "timing_s/step" in r["data"]}
    assert max(steps[guide]) == 20 and max(steps[fast]) == 10 and res["steady_upto"] == 10
    for side, run in (("guide_s", guide), ("fast_s", fast)):
        want = [steps[run][s] for s in range(2, 11)]
        assert abs(res["phases_s"]["step"][side] - sum(want) / len(want)) < 1e-9
    assert "steady (steps 2-10)" in p.stdout
