"""The health report of a job: the guide's "what to watch in the logs" read for you.

    python -m grpo_lab.after_run.report RUN_DIR         (make report RUN=outputs/runs/<job>)

What it prints and writes, and where each part lives: docs/after_run.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpo_lab import facts
from grpo_lab.after_run.job_report import format_report, make_report
from grpo_lab.after_run.report_checks import (
    BAD, CLIP_BAD, CLIP_WARN, ENTROPY_FLOOR, ENTROPY_RATIO_BAD, ENTROPY_RATIO_WARN, GIB_GB, KV_SHORT, MEM_BAD, MEM_WARN,
    OK, PG_CLIPFRAC_BAD, PG_CLIPFRAC_WARN, PLAN_OFF, PPO_KL_BAD, PPO_KL_WARN, PROBS_DIFF_BAD, PROBS_DIFF_WARN, WARN, Check,
    Trend, check_clip_ratio, check_entropy, check_kv_cache, check_memory, check_pg_clipfrac, check_ppo_kl,
    check_random_weights, check_response_max, check_reward, check_rollout_precision, check_status, check_throughput,
    check_timing, check_validation, run_checks, t_critical, trend)
from grpo_lab.after_run.report_plot import plot_run
from grpo_lab.after_run.run_info import RunInfo, load_run

# the report's names, for `from grpo_lab.after_run import report` users (tests, scripts)
__all__ = [
    "OK", "WARN", "BAD", "CLIP_WARN", "CLIP_BAD", "PG_CLIPFRAC_WARN", "PG_CLIPFRAC_BAD", "PPO_KL_WARN", "PPO_KL_BAD",
    "ENTROPY_FLOOR", "ENTROPY_RATIO_WARN", "ENTROPY_RATIO_BAD", "MEM_WARN", "MEM_BAD", "PROBS_DIFF_WARN",
    "PROBS_DIFF_BAD", "KV_SHORT", "PLAN_OFF", "GIB_GB", "t_critical", "Check", "Trend", "trend", "RunInfo", "load_run",
    "check_reward", "check_validation", "check_clip_ratio", "check_response_max", "check_entropy", "check_pg_clipfrac",
    "check_ppo_kl", "check_timing", "check_throughput", "check_memory", "check_rollout_precision", "check_kv_cache",
    "check_random_weights", "check_status", "run_checks", "plot_run", "make_report", "format_report",
    "is_sweep_dir", "writes_allowed", "main",
]


# ---------------------------------------------------------------------------------------------------------------------
# entry points


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
    if not p.is_relative_to(root):
        return True
    return p.is_relative_to(root / "outputs")


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
    report = make_report(path, plots=not args.no_plots, write=write)
    print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
