"""The failure doctor: read a verl job's log and say what went wrong and which override to try (python -m
grpo_lab.after_run.doctor LOGFILE_OR_JOB_DIR). What it matches, the watchdog and the modules: docs/after_run.md."""

from grpo_lab.after_run.doctor.logread import Diagnosis, Log, printed_config, read_json, read_log
from grpo_lab.after_run.doctor.signatures import fatal_line, phase_remedies
from grpo_lab.after_run.doctor.stops import gone_running
from grpo_lab.after_run.doctor.verdict import (
                                               diagnose_path,
                                               errors_in,
                                               failure_class,
                                               format_diagnoses,
                                               refusal,
                                               write_diagnosis,
)
from grpo_lab.after_run.doctor.watchdog import ProgressWatchdog

__all__ = ["fatal_line", "Diagnosis", "Log", "ProgressWatchdog", "diagnose_path", "errors_in", "failure_class",
           "format_diagnoses", "gone_running", "phase_remedies", "printed_config", "read_json", "read_log", "refusal",
           "write_diagnosis"]
