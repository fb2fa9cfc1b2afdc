"""The health report of a job: the guide's "what to watch in the logs" read for you (python -m
grpo_lab.after_run.report RUN_DIR, make report RUN=outputs/runs/<job>). What it prints and writes: docs/after_run.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpo_lab import facts
from grpo_lab.after_run.job_report import format_report, make_report

# ---------------------------------------------------------------------------------------------------------------------
# entry points


RUN_FILES = (".hydra", "status.json", "plan.json", "train.log", "metrics.jsonl", "verl_config.yaml")  # a job's


def is_sweep_dir(path: str | Path) -> bool:
    p = Path(path)
    if (p / "multirun.yaml").exists():
        return True
    if (p / "metrics.jsonl").exists() or (p / "train.log").exists() or (p / ".hydra").exists():
        return False
    return any(d.is_dir() and d.name.startswith("job") for d in p.iterdir()) if p.is_dir() else False


def writes_allowed(path: str | Path) -> bool:
    """Whether `make report` may write into this folder: anywhere but the repository's own files, i.e. under the
    project's outputs/ or outside the repository; a recorded run committed under benchmarks/ is only printed."""
    p = Path(path).resolve()
    root = facts.ROOT.resolve()
    return not p.is_relative_to(root) or p.is_relative_to(root / "outputs")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grpo_lab.after_run.report",
                                 description="Health report of a job dir, or the summary of a sweep dir.")
    ap.add_argument("run_dir")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG")
    ap.add_argument("--write", action="store_true",
                    help="write report.json/.png (or the sweep summary) even into a folder of the repository outside "
                         "outputs/, e.g. a recorded run under benchmarks/ (by default those are only printed)")
    args = ap.parse_args(argv)
    path = Path(args.run_dir)
    if not path.is_dir():
        print(f"grpo-lab report: {path} is not a directory", file=sys.stderr)
        return 2
    write = args.write or writes_allowed(path)
    if is_sweep_dir(path):
        from grpo_lab.after_run.summary import format_summary, summarize_sweep

        table = summarize_sweep(path, plots=not args.no_plots, write=write)
        print(format_summary(path, table, written=write))
        return 0
    if not any((path / f).exists() for f in RUN_FILES):
        print(f"grpo-lab report: {path} is not a run folder: a run folder (outputs/runs/<job>, made by python run.py) "
              f"holds {', '.join(RUN_FILES)}; nothing written", file=sys.stderr)
        return 2
    report = make_report(path, plots=not args.no_plots, write=write)
    print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
