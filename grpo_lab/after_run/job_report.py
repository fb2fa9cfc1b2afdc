"""One job's report: the checks run on a job dir, report.json and report.png written (`make_report`, also called by
the sweep summary's callback), and the text `make report` prints (`format_report`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_lab import facts
from grpo_lab.after_run import doctor
from grpo_lab.after_run import metrics as M
from grpo_lab.after_run.report_checks import BAD, OK, WARN, run_checks
from grpo_lab.after_run.report_plot import plot_run
from grpo_lab.after_run.run_info import load_run


def make_report(run_dir: str | Path, *, plots: bool = True, write: bool = True) -> dict[str, Any]:
    """Run the checks on a job dir; write report.json (and report.png) beside metrics.jsonl. Returns the report."""
    run = load_run(run_dir)
    checks, diags = run_checks(run)
    steps = M.training_steps(run.df)
    report: dict[str, Any] = {
        "run_dir": str(run.run_dir),
        "status": run.status.get("status", "unknown"),
        "steps": int(steps.max()) if len(steps) else 0,
        "checks": [c.to_dict() for c in checks],
        "diagnoses": [d.to_dict() for d in diags],
        "plots": [],
        "written": write,
    }
    if write:
        if plots:
            try:
                png = plot_run(run, run.run_dir / "report.png")
                if png:
                    report["plots"].append(png.name)
            except Exception as e:  # a plot must not cost the verdicts
                report["plot_error"] = f"{type(e).__name__}: {e}"
        facts.atomic_write(run.run_dir / "report.json", json.dumps(report, indent=2) + "\n")
    return report


_MARK = {OK: "ok  ", WARN: "WARN", BAD: "BAD "}


def format_report(report: dict[str, Any]) -> str:
    out = [f"grpo-lab report: {report['run_dir']} (status {report['status']}, step {report['steps']})"]
    out += [f"  [{_MARK.get(c['status'], c['status'])}] {c['metric']}: {c['message']}" for c in report["checks"]]
    out += [doctor.Diagnosis(**d).format() for d in report.get("diagnoses", [])]
    if report.get("plots"):
        out.append("  plots: " + ", ".join(str(Path(report["run_dir"]) / p) for p in report["plots"]))
    counts = {s: sum(c["status"] == s for c in report["checks"]) for s in (OK, WARN, BAD)}
    where = (f"written to {Path(report['run_dir']) / 'report.json'}" if report.get("written", True) else
             "nothing written: a recorded run outside outputs/ (--write writes report.json and report.png there)")
    out.append(f"  {counts[OK]} ok, {counts[WARN]} warn, {counts[BAD]} bad; {where}")
    return "\n".join(out)
