"""`python -m grpo_lab.after_run.doctor LOG_OR_JOB_DIR [--json]` (make doctor LOG=...): prints the diagnoses; exit 2
for a path that does not exist or a file that is no verl or grpo-lab log, else 0."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grpo_lab.after_run.doctor.verdict import NOT_A_LOG, diagnose_path, format_diagnoses


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grpo_lab.after_run.doctor",
                                 description="Diagnose a verl job's log (or a job dir's train.log).")
    ap.add_argument("log", help="log file, or a job dir with train.log")
    ap.add_argument("--json", action="store_true", help="print the diagnoses as JSON")
    ap.add_argument("--stale-minutes", type=float, default=10.0,
                    help="a running job's log unchanged this long counts as stalled (default 10)")
    args = ap.parse_args(argv)
    path = Path(args.log)
    if not path.exists():
        print(f"grpo-lab doctor: {path} does not exist", file=sys.stderr)
        return 2
    log_path, ds = diagnose_path(path, stale_minutes=args.stale_minutes)
    print(json.dumps([d.to_dict() for d in ds], indent=2) if args.json else format_diagnoses(ds, str(log_path)))
    return 2 if [d.id for d in ds] == [NOT_A_LOG] else 0

