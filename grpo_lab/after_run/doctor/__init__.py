"""The failure doctor: read a verl job's log and say what went wrong and which override to try.

    python -m grpo_lab.after_run.doctor LOGFILE          (make doctor LOG=outputs/runs/<job>/train.log)
    python -m grpo_lab.after_run.doctor JOB_DIR          (its train.log, with the job's verl_config.yaml for exact values)

`diagnose(text)` matches the guide's troubleshooting table (../shared/SPEC.md, "When things go wrong") and the
other known signatures of verl 0.9.1 + vLLM + Ray on small boxes. A CUDA out-of-memory is placed in its phase from
the traceback frames around it (vLLM's engine, sampler or KV cache: generation; the FSDP worker's update_actor,
backward, optimizer step or compute_log_prob: training), because the two phases have different remedies.
A log that stops without an error is read for where it stopped (the V1 trainer's silent hang after its config print
when Ray has too few CPUs, a stall at NCCL initialisation). Every diagnosis names the exact overrides to try, with
values computed from the job's own config when the log or verl_config.yaml has it.

`ProgressWatchdog(log_path).start()/.stop()` warns once when a running job's log shows no progress for N minutes.

The modules, in the order a log passes them: logread (the log's lines, the config verl printed, the job's values,
Diagnosis), signatures (the known error texts, in match order), stops (a log that ends in an unknown exception or
without an error, a dead engine, a gone process), verdict (diagnose, a job folder, the preflight's refusal,
diagnosis.json), watchdog (a running job), command (the command line; __main__ runs it). This package re-exports
what other modules use. Every diagnosis id is registered in SIGNATURES (signatures.py), in the shape the preflight's
rules share (grpo_lab/registry.py: id, kind, phase).
"""

from grpo_lab.after_run.doctor.logread import Diagnosis, Log, Values, printed_config, read_json, read_log
from grpo_lab.after_run.doctor.signatures import SIGNATURES, generation_oom_overrides, training_oom_overrides
from grpo_lab.after_run.doctor.stops import gone_running
from grpo_lab.after_run.doctor.verdict import (NOT_A_LOG, diagnose, diagnose_file, diagnose_path, errors_in,
                                               failure_class, format_diagnoses, not_a_log, refusal, write_diagnosis)
from grpo_lab.after_run.doctor.watchdog import ProgressWatchdog, watch_progress
from grpo_lab.after_run.doctor.command import main

__all__ = ["NOT_A_LOG", "SIGNATURES", "Diagnosis", "Log", "ProgressWatchdog", "Values", "diagnose", "diagnose_file",
           "diagnose_path", "errors_in", "failure_class", "format_diagnoses", "generation_oom_overrides",
           "gone_running", "main", "not_a_log", "printed_config", "read_json", "read_log", "refusal",
           "training_oom_overrides", "watch_progress", "write_diagnosis"]
