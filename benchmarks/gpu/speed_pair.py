"""Two runs of one job, the guide's settings against faster ones (issue 27 item 2): the steady step and each phase
(verl's timing_s/*), the ratio guide / fast, each run's training peak against its own plan (`make report`'s check),
the first steps' loss, reward and entropy side by side, and the validation accuracy at each step both validated.

    python3 benchmarks/gpu/speed_pair.py GUIDE_RUN FAST_RUN [--step N] [--json OUT]

A run is a job folder (metrics.jsonl, plan.json, verl_config.yaml). The steady step is the mean over the steps after
the first (step 1 carries the warm-up) up to the last step both runs trained (answers shorten as a model learns, so a
longer run's later steps are shorter: a run of 20 steps is compared with one of 10 over steps 2-10); a run of one step
has none and is refused. --step N compares step N of both
runs instead (a run stopped after its first step: step 1 against step 1, both with their warm-up).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from grpo_lab.after_run import metrics as M  # noqa: E402
from grpo_lab.after_run.report_checks import check_memory  # noqa: E402
from grpo_lab.after_run.run_info import load_run  # noqa: E402

PHASES = {"generation": "timing_s/gen", "old log-prob": "timing_s/old_log_prob", "reference": "timing_s/ref",
          "actor update": "timing_s/update_actor", "weight sync": "timing_s/update_weights", "step": "timing_s/step"}
CURVES = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "critic/score/mean", "response_length/mean")


def steady(df, name: str, upto: int) -> float | None:
    """Mean of the metric over the trained steps after the first, up to step `upto`."""
    s = M.train_series(df, name).dropna()
    s = s.iloc[1:].loc[:upto]
    return float(s.mean()) if len(s) else None


def at_step(df, name: str, step: int) -> float | None:
    """The metric at one trained step."""
    s = M.train_series(df, name).dropna()
    return float(s[step]) if step in s.index else None


def compare(guide_dir: Path, fast_dir: Path, step: int | None = None) -> dict:
    runs = {"guide": load_run(guide_dir), "fast": load_run(fast_dir)}
    for label, run in runs.items():
        steps = M.training_steps(run.df)
        if step is None and len(steps) < 2:
            raise SystemExit(f"speed_pair: {run.run_dir} ({label}) has fewer than 2 trained steps in metrics.jsonl: "
                             "no steady step to compare (--step 1 compares the first steps)")
        if step is not None and step not in steps:
            raise SystemExit(f"speed_pair: {run.run_dir} ({label}) has no trained step {step} in metrics.jsonl "
                             f"(its steps: {', '.join(map(str, steps)) or 'none'})")
    # the steady steps: after the first, up to the last step both trained
    upto = min(int(M.training_steps(r.df).max()) for r in runs.values())
    phases = {}
    for phase, metric in PHASES.items():
        g, f = (steady(r.df, metric, upto) if step is None else at_step(r.df, metric, step) for r in runs.values())
        phases[phase] = {"guide_s": g, "fast_s": f, "ratio": g / f if g and f else None}
    curves = {}
    for metric in CURVES:
        g, f = (M.train_series(r.df, metric).dropna() for r in runs.values())
        curves[metric] = side_by_side(g, f)
    # the validation metric to follow (accuracy mean@N where there is one), step 0 included: whether both learn alike
    cols = [M.primary_val_column(r.df) for r in runs.values()]
    validation = {"metric": cols[0] if cols[0] == cols[1] else None, "rows": []}
    if validation["metric"]:
        g, f = (M.series(r.df, validation["metric"]) for r in runs.values())
        validation["rows"] = side_by_side(g, f)
    memory = {label: check_memory(run).to_dict() for label, run in runs.items()}
    return {"guide": str(guide_dir), "fast": str(fast_dir), "step": step, "steady_upto": upto, "phases_s": phases,
            "curves": curves, "validation": validation, "memory": memory}


def side_by_side(g, f) -> list[dict]:
    """The steps both series have, each with both values."""
    return [{"step": int(s), "guide": float(g[s]), "fast": float(f[s])} for s in sorted(set(g.index) & set(f.index))]


def cell(v: float | None, width: int) -> str:
    return f"{v:>{width}.2f}" if v is not None else f"{'-':>{width}}"


def render(res: dict) -> str:
    which = f"steady (steps 2-{res['steady_upto']})" if res["step"] is None else f"step {res['step']}"
    out = [f"guide: {res['guide']}", f"fast:  {res['fast']}", "",
           f"{which:<18}{'guide s':>9}{'fast s':>9}{'guide/fast':>12}"]
    for phase, p in res["phases_s"].items():
        out.append(f"{phase:<18}{cell(p['guide_s'], 9)}{cell(p['fast_s'], 9)}{cell(p['ratio'], 11)}x")
    out += ["", "first steps, guide | fast (same seed)"]
    for metric, rows in res["curves"].items():
        cells = ", ".join(f"{r['step']}: {r['guide']:.4g} | {r['fast']:.4g}" for r in rows)
        out.append(f"  {metric}: {cells or '-'}")
    val = res["validation"]
    cells = ", ".join(f"{r['step']}: {r['guide']:.3f} | {r['fast']:.3f}" for r in val["rows"])
    out += ["", f"validation, guide | fast: {val['metric'] or 'no metric both runs have'}", f"  {cells or '-'}"]
    out += ["", "training peak against each run's plan"]
    out += [f"  {label}: [{c['status']}] {c['message']}" for label, c in res["memory"].items()]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("guide", type=Path)
    ap.add_argument("fast", type=Path)
    ap.add_argument("--step", type=int, help="compare this step of both runs instead of the steady mean")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    res = compare(a.guide, a.fast, a.step)
    print(render(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
