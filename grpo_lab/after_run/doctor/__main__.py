"""Runs the doctor: `python -m grpo_lab.after_run.doctor LOG_OR_JOB_DIR` (grpo_lab/after_run/doctor/command.py)."""

import sys

from grpo_lab.after_run.doctor.command import main

if __name__ == "__main__":
    sys.exit(main())
