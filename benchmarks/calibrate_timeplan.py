"""Fit the time plan's fixed costs to every recorded solo GPU run, and say how close the plan comes to each.

    python benchmarks/calibrate_timeplan.py            # per job and phase: predicted vs measured; exit 1 when a job's
                                                       # steady step is outside the stated 25%
    python benchmarks/calibrate_timeplan.py --write    # write benchmarks/gpu/timeplan_calibration.{json,md} (exit 0;
                                                       # the jobs outside are named there and on stderr)
    make calibrate                                     # both calibrations, written

A job is a folder under benchmarks/gpu/results/ with its verl_config.yaml and metrics.jsonl; jobs launched beside
others (calibrate_memplan.side_by_side) or sharing the card (their status.json intervals overlap, jobs_on_card) are not
fitted; those sharing it give the plan's growth per extra job on the card (sharing_factor).
Each phase's verl timer (timing_s/*) of the steady
steps (2 on, validation taken out) is the physics of grpo_lab/memory/timeplan.py at the job's measured lengths plus
seconds per count, fitted by non-negative least squares over the jobs. Start-up ("ready to fit") and the first
validation come from the stamped logs (<job>.log.gz beside the folder, benchmarks/gpu/stamp.py). verl's fused log-prob
(use_fused_kernels) is fitted like the other terms over the recorded full steps with it; a pass none fitted takes
its seconds per 512-token chunk from the recorded pass_bench runs (pass_bench_*.json): the fitted per-token loop term
less the seconds the switch saved there.
docs/time_plan.md.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks", ROOT / "benchmarks" / "gpu"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import numpy as np  # noqa: E402
from calibrate_memplan import RESULTS, _yaml, job_model_facts, model_facts, rel, run_cli, side_by_side  # noqa: E402
from phases import milestones  # noqa: E402

from grpo_lab.after_run.metrics import step_less_validation  # noqa: E402
from grpo_lab.labconf import Lab  # noqa: E402
from grpo_lab.memory import memplan, timeplan  # noqa: E402
from grpo_lab.memory.settings import settings_from_verl  # noqa: E402

COMMAND = "python benchmarks/calibrate_timeplan.py --write"
H200 = timeplan.Card("H200", timeplan.MEASURED["bf16_tflops"], timeplan.MEASURED["memory_gb_s"], 25.0, 25.0, 0.0)


def card_of(job: Path) -> tuple[timeplan.Card, float]:
    """The card a job ran on and its memory (GiB, the real card's under an emulation), from its composed lab.hardware
    (.hydra/config.yaml); the H200 where it says nothing. verl_config.yaml's vLLM share is of that real card."""
    cfg = job / ".hydra" / "config.yaml"
    hw = ((_yaml(cfg) or {}).get("lab") or {}).get("hardware") or {} if cfg.is_file() else {}
    name, flops, bw = str(hw.get("gpu_name") or ""), hw.get("bf16_tflops"), hw.get("memory_gb_s")
    real_gb = float((hw.get("emulate") or {}).get("real_gpu_memory_gb") or hw.get("gpu_memory_gb") or 139.8)
    if not name or "H200" in name or not flops or not bw:
        return H200, real_gb
    return timeplan.Card(name, float(flops), float(bw), 25.0, 25.0, 0.0), real_gb


def steps_of(job: Path) -> list[dict[str, float]]:
    rows = []
    for line in (job / "metrics.jsonl").read_text().splitlines():
        try:
            d = json.loads(line).get("data", {})
        except ValueError:
            continue  # a line cut short when the job was killed
        if "timing_s/step" in d:
            rows.append(d)
    return rows


def stamped_log(job: Path) -> Path | None:
    for f in (job.parent / f"{job.name}.log.gz", job.parent / f"{job.name}.log"):
        if f.is_file():
            return f
    return None


def startup_of(job: Path) -> dict[str, float] | None:
    """Seconds from launch to "ready to fit", and to step 1's end, from the job's stamped log."""
    f = stamped_log(job)
    if f is None:
        return None
    with tempfile.TemporaryDirectory() as d:  # its own: calibrations at once share no file
        tmp = Path(d) / f"{job.name}.log"
        tmp.write_bytes(gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes())
        m = milestones(str(tmp))
    return {"ready_s": m["ready to fit"], "step1_done_s": m.get("step 1 done")} if "ready to fit" in m else None


def interval(job: Path) -> tuple[datetime, datetime] | None:
    """When a job held the card, from its status.json: started to ended; a job cut off (no `ended`) to its stamped
    log's last second, else to the end of time."""
    f = job / "status.json"
    st = json.loads(f.read_text()) if f.is_file() else {}
    if not st.get("started"):
        return None
    start, log = datetime.fromisoformat(st["started"]), stamped_log(job)
    if st.get("ended"):
        return start, datetime.fromisoformat(st["ended"])
    if log is not None:
        text = (gzip.decompress(log.read_bytes()) if log.suffix == ".gz" else log.read_bytes()).decode(errors="replace")
        stamps = [float(m) for m in re.findall(r"^\s*(\d+\.\d+) ", text, re.M)]
        if stamps:
            return start, start + timedelta(seconds=stamps[-1])
    return start, datetime.max


def jobs_on_card(job: Path, results: Path = RESULTS) -> int:
    """The most jobs that held the card at once while this one did, itself included: the overlaps of the status.json
    intervals in its results folder (results/<date>/...)."""
    mine = interval(job)
    if mine is None or not job.is_relative_to(results):
        return 1
    spans = [iv for f in (results / job.relative_to(results).parts[0]).rglob("status.json")
             if (iv := interval(f.parent)) and iv[0] < mine[1] and mine[0] < iv[1]]
    return max(sum(a <= t < b for a, b in spans) for t in [mine[0], *(a for a, _ in spans if a > mine[0])])


def replay(job: Path, facts: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    rows = steps_of(job)
    if not rows:
        return None
    verl = _yaml(job / "verl_config.yaml")
    model_path = str(verl["actor_rollout_ref"]["model"]["path"]).rstrip("/")
    info = facts.get(model_path.rsplit("/", 1)[-1]) or job_model_facts(job)
    arch = memplan.Arch.from_mapping(info, source=info["name"])
    card, real_gb = card_of(job)
    s = settings_from_verl(verl, Lab.of({"hardware": {"gpu_memory_gb": real_gb}}))
    kv = memplan.kv_cache(arch, s)
    steady = [r for r in rows if r.get("training/global_step", 0) >= 2] or []
    out: dict[str, Any] = {"job": rel(job), "model": info["name"], "card": card.name, "side_by_side": side_by_side(job),
                           "jobs_on_card": jobs_on_card(job),
                           "steps": len(rows), "steady_steps": len(steady), "fused": s.use_fused_kernels,
                           "update_tokens": s.update_tokens}
    if steady:
        per_step = []
        for r in steady:
            w = timeplan.Work(s.train_batch_size * s.rollout_n / max(1, s.n_gpus), float(r["prompt_length/mean"]),
                              float(r["response_length/mean"]), float(r["response_length/max"]))
            measured = {ph: float(r[f"timing_s/{t}"]) for ph, t in timeplan.TIMERS.items() if f"timing_s/{t}" in r}
            step = step_less_validation(r)
            measured["other"] = step - sum(measured.values())
            per_step.append({"step_s": step, "measured_s": measured,
                             "features": timeplan.features(arch, s, w, card, kv), "tokens": w.tokens})
        out["per_step"] = per_step
        out["step_s"] = round(statistics.fmean(p["step_s"] for p in per_step), 2)
        out["measured_s"] = {ph: round(statistics.fmean(p["measured_s"].get(ph, 0.0) for p in per_step), 2)
                             for ph in timeplan.PHASES}
        out["tokens_per_gpu"] = round(statistics.fmean(p["tokens"] for p in per_step))
        first = step_less_validation(rows[0])
        out["first_step_extra_s"] = round(first - out["step_s"], 2)
    st = startup_of(job)
    if st:
        out["startup_s"] = round(st["ready_s"], 1)
        out["load_s"] = round(3 * 2.0 * arch.params / (timeplan.DISK_GB_S * 1e9), 2)
        if st["step1_done_s"] and verl.get("trainer", {}).get("val_before_train", True):
            out["first_validation_s"] = round(st["step1_done_s"] - st["ready_s"] - float(rows[0]["timing_s/step"]), 1)
    tests = [float(r["timing_s/testing"]) for r in rows if "timing_s/testing" in r]
    if tests:
        out["validation_s"] = round(statistics.fmean(tests), 2)
    return out


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients: drop the most negative and solve again."""
    active = [j for j in range(a.shape[1]) if a[:, j].any()]
    while True:
        x = np.zeros(a.shape[1])
        if not active:
            return x
        x[active] = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
        neg = [j for j in active if x[j] < 0]
        if not neg:
            return x
        active.remove(min(neg, key=lambda j: x[j]))


def fit(jobs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Seconds per count of each phase, over every steady step of every solo job (each step a row)."""
    coef: dict[str, dict[str, float]] = {}
    steps = [p for j in jobs for p in j["per_step"]]
    for phase in timeplan.PHASES:
        rows = [p for p in steps if phase in p["measured_s"] and p["features"][phase]["count"]]
        if not rows:
            continue
        names = sorted({k for p in rows for k in p["features"][phase]["count"]})
        a = np.array([[p["features"][phase]["count"].get(k, 0.0) for k in names] for p in rows])
        b = np.array([p["measured_s"][phase] - p["features"][phase]["physics_s"] for p in rows])
        x = nnls(a, b)
        coef[phase] = {k: float(f"{v:.6g}") for k, v in zip(names, x, strict=True) if v > 0}
    return coef


def fused_from_passes(coef: dict[str, dict[str, float]], results: Path = RESULTS) -> dict[str, Any]:
    """Per training pass, the seconds per 512-token chunk that leave the plan's step as much shorter as the switch made
    that pass in every recorded pass_bench run ((loop term x tokens - (guide_s - fused_s)) / chunks; the median)."""
    per_pass: dict[str, list[float]] = {}
    files = sorted(results.rglob("pass_bench_*.json"))
    for f in files:
        for phase, row in json.loads(f.read_text())["passes"].items():
            loop = (coef.get(phase) or {}).get("loop_tokens")
            if loop:
                chunks = math.ceil(row["tokens"] / timeplan.FUSED_CHUNK)
                saved = row["guide_s"] - row["fused_s"]
                per_pass.setdefault(phase, []).append(round(max(0.0, loop * row["tokens"] - saved) / chunks, 5))
    return {"files": [rel(f) for f in files], "per_run_s": per_pass,
            "fused_chunks": {k: float(f"{statistics.median(v):.4g}") for k, v in per_pass.items()}}


def planned_alone(per_step: list[dict[str, Any]], coef: dict[str, dict[str, float]]
                  ) -> tuple[dict[str, float], float]:
    """The plan of a job's steady steps at their own lengths, alone on the card: per phase (mean) and the step."""
    preds = [timeplan.phase_seconds(p["features"], coef) for p in per_step]
    pred = {ph: statistics.fmean(p[ph] for p in preds) for ph in timeplan.PHASES}
    return {k: round(v, 2) for k, v in pred.items()}, round(sum(pred.values()), 2)


def sharing_factor(shared: list[dict[str, Any]], coef: dict[str, dict[str, float]]) -> float:
    """A step's growth per extra job on the card, (measured / planned alone - 1) / (jobs on the card - 1), the median
    over the jobs that shared it; each job's row gets its plan alone and shared (timeplan.sharing)."""
    for j in shared:
        j["planned_alone_s"] = planned_alone(j.pop("per_step"), coef)[1]
        j["growth_per_extra_job"] = round((j["step_s"] / j["planned_alone_s"] - 1) / (j["jobs_on_card"] - 1), 3)
    k = round(statistics.median(j["growth_per_extra_job"] for j in shared), 3) if shared else 0.0
    for j in shared:
        j["planned_shared_s"] = round(j["planned_alone_s"] * (1 + k * (j["jobs_on_card"] - 1)), 2)
        j["ratio"] = round(j["planned_shared_s"] / j["step_s"], 3)
    return k


def collect(results: Path = RESULTS) -> dict[str, Any]:
    facts = model_facts()
    jobs, beside = [], []
    for d in sorted(p for p in results.rglob("*") if (p / "verl_config.yaml").is_file() and
                    (p / "metrics.jsonl").is_file()):
        j = replay(d, facts)
        if j is None:
            continue
        (beside if j["side_by_side"] or j["jobs_on_card"] > 1 else jobs).append(j)
    steady = [j for j in jobs if "step_s" in j]
    coef = fit(steady)
    fused = fused_from_passes(coef, results)
    for phase, v in fused["fused_chunks"].items():  # where no full step with it was fitted
        coef[phase].setdefault("fused_chunks", v)
    for j in steady:
        j["predicted_s"], j["predicted_step_s"] = planned_alone(j.pop("per_step"), coef)
        j["ratio"] = round(j["predicted_step_s"] / j["step_s"], 3)
    shared = [j for j in beside if "step_s" in j and j["jobs_on_card"] > 1]
    per_extra_job = sharing_factor(shared, coef)
    starts = [j["startup_s"] - j["load_s"] for j in jobs if "startup_s" in j]
    first_val = [j["first_validation_s"] - j.get("validation_s", 0.0) for j in jobs if "first_validation_s" in j]
    ratios = [j["ratio"] for j in steady]
    return {
        "command": COMMAND, "stated": timeplan.STATED, "card": timeplan.MEASURED,
        "assumed": {"mfu": timeplan.MFU, "bw_share": timeplan.BW_SHARE, "disk_gb_s": timeplan.DISK_GB_S,
                    "unmeasured": timeplan.UNMEASURED},
        "coefficients": coef,
        "fused_from_passes": {k: fused[k] for k in ("files", "per_run_s")},
        # the full steps that check the pass-level term: once there is one, the plan no longer calls it not measured
        "full_steps_with": {"fused_chunks": [j["job"] for j in steady if j["fused"]]},
        # the update micro-batch sizes the fit saw: a plan beyond them extrapolates its per-micro-batch cost
        "measured_range": {"update_tokens": [min(j["update_tokens"] for j in steady),
                                             max(j["update_tokens"] for j in steady)]} if steady else {},
        "first_step_extra_s": round(statistics.fmean(j["first_step_extra_s"] for j in steady), 1),
        "startup_fixed_s": round(statistics.fmean(starts), 1) if starts else 0.0,
        "startup_measured_s": [j["startup_s"] for j in jobs if "startup_s" in j],
        "first_validation_extra_s": round(statistics.fmean(first_val), 1) if first_val else 0.0,
        "accuracy": {"runs": len(steady), "step_ratio_min": min(ratios), "step_ratio_max": max(ratios)}
        if ratios else {},
        "jobs": jobs,
        "side_by_side_not_fitted": [j["job"] for j in beside],
        # jobs sharing the card: a step planned alone x (1 + per_extra_job x the other jobs), timeplan.sharing
        "sharing": {"per_extra_job": per_extra_job, "jobs": [
            {k: j[k] for k in ("job", "model", "card", "jobs_on_card", "step_s", "planned_alone_s",
                               "growth_per_extra_job", "planned_shared_s", "ratio")} for j in shared]},
    }


def outside(result: dict[str, Any]) -> list[str]:
    return [f"{j['job']}: steady step planned {j['predicted_step_s']} s, measured {j['step_s']} s (ratio "
            f"{j['ratio']}, stated {1 - result['stated']:.2f}-{1 + result['stated']:.2f})"
            for j in result["jobs"] if "ratio" in j and abs(j["ratio"] - 1) > result["stated"]]


def render(result: dict[str, Any]) -> str:
    acc = result["accuracy"]
    out = ["# Time plan vs the recorded solo GPU runs", "",
           f"Written by `{result['command']}` (`make calibrate`); do not edit by hand. Seconds on one GPU of the "
           f"test machine, an H200 or an H100 (the card column; verl 0.9.1, vLLM 0.24, sdpa attention). Each phase "
           f"is grpo_lab/memory/timeplan.py's physics on the job's card at its measured lengths plus fitted seconds "
           f"per count (docs/time_plan.md). Steady step: the mean of steps 2 on, without validation (verl 0.9.1 times "
           f"it outside the step). Stated accuracy: every solo run's steady step within "
           f"{result['stated']:.0%}; here {acc.get('step_ratio_min', 0):.2f}-{acc.get('step_ratio_max', 0):.2f} "
           f"of measured on {acc.get('runs', 0)} run(s).", "",
           "## Fitted seconds per count", "", "| phase | term | seconds |", "|---|---|---|"]
    for phase, c in result["coefficients"].items():
        out += [f"| {phase} | {k} | {v:.4g} |" for k, v in c.items()]
    fp = result.get("fused_from_passes") or {}
    if fp.get("files"):
        checked = [j for j in result["jobs"] if j["job"] in result["full_steps_with"]["fused_chunks"]]
        out += ["", "fused_chunks (verl's fused log-prob, `speed=fused`): fitted over the full steps with it; the "
                "training passes alone (benchmarks/gpu/pass_bench.py: " + ", ".join(fp["files"]) + ") give, as the "
                "loop term less what the switch saved there, per 512-token chunk (each run: "
                + "; ".join(f"{k} {', '.join(f'{x * 1e3:.1f}' for x in v)} ms" for k, v in fp["per_run_s"].items())
                + "; the median is taken for a pass no full step fitted). Full steps with it, planned / measured: "
                + (", ".join(f"{j['job']} {j['predicted_step_s']} / {j['step_s']} s" for j in checked) or "none yet")
                + "."]
    lo_hi = (result.get("measured_range") or {}).get("update_tokens")
    if lo_hi:
        out += ["", f"Update micro-batches of the fitted runs: {lo_hi[0]}-{lo_hi[1]} tokens (a plan above that "
                "extrapolates the seconds per micro-batch, and says so)."]
    out += ["", f"First step: {result['first_step_extra_s']} s above a steady step (mean). Start-up to \"ready to "
            f"fit\": {result['startup_fixed_s']} s plus the weights' loading (measured "
            f"{', '.join(str(x) for x in result['startup_measured_s'])} s). First validation: "
            f"{result['first_validation_extra_s']} s above a later one (verl's agent-loop workers start on first "
            f"use).", "", "## Per job (steady step)", "",
            "| job | model | card | tokens/GPU | measured s | planned s | ratio | generation | old log-prob | "
            "reference | update | sync | other (measured / planned) |", "|---" * 13 + "|"]
    for j in result["jobs"]:
        if "ratio" not in j:
            continue
        cells = [f"{j['measured_s'].get(p, 0):.1f} / {j['predicted_s'][p]:.1f}" for p in timeplan.PHASES]
        out.append(f"| {j['job']} | {j['model']} | {j.get('card', 'H200')} | {j['tokens_per_gpu']} | {j['step_s']} | "
                   f"{j['predicted_step_s']} | {j['ratio']} | " + " | ".join(cells) + " |")
    if outside(result):
        out += ["", "Outside the stated accuracy: " + "; ".join(outside(result)) + " (docs/time_plan.md, Accuracy)."]
    sh = result.get("sharing") or {}
    if sh.get("jobs"):
        out += ["", "## Jobs sharing the card", "",
                f"Runs whose status.json intervals overlap others' in their results folder (jobs on the card: the "
                f"most at once while it ran). A plan of k jobs at once (hydra/launcher=side_by_side) takes a step "
                f"planned alone x (1 + {sh['per_extra_job']} x (k - 1)): the median growth per extra job below.", "",
                "| job | model | jobs on the card | measured s | planned alone s | growth per extra job | planned "
                "shared s | ratio |", "|---" * 8 + "|"]
        out += [f"| {j['job']} | {j['model']} | {j['jobs_on_card']} | {j['step_s']} | {j['planned_alone_s']} | "
                f"{j['growth_per_extra_job']} | {j['planned_shared_s']} | {j['ratio']} |" for j in sh["jobs"]]
    if result["side_by_side_not_fitted"]:
        out += ["", "Launched beside other jobs (timings not evidence, not fitted): "
                + ", ".join(result["side_by_side_not_fitted"]) + "."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, __doc__, timeplan.TABLE, ROOT / timeplan.TABLE_MD, collect, render, outside,
                   fail_on_write=False)


if __name__ == "__main__":
    sys.exit(main())
