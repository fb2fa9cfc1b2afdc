"""The doctor's verdict on a log or a job folder: every signature in match order, else a dead engine, else where
the log stopped; the preflight's refusal of a job; what the launcher prints and writes (diagnosis.json)."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from grpo_lab import facts, loglines
from grpo_lab.after_run.doctor.logread import (
    Diagnosis,
    Log,
    already_set,
    load_yaml,
    printed_config,
    read_json,
    read_log,
    with_ray_init,
)
from grpo_lab.after_run.doctor.signatures import SIGNATURES, known, matchers
from grpo_lab.after_run.doctor.stops import engine_died, stall
from grpo_lab.labconf import Lab
from grpo_lab.memory.run import Run


def diagnose(text: str, config: dict[str, Any] | None = None, *, lab: Lab | None = None,
             plan: dict[str, Any] | None = None, idle_s: float | None = None, stale_minutes: float = 10.0,
             stalls: bool = True) -> list[Diagnosis]:
    """What went wrong in this log, in the order of the evidence in the log. config: the job's verl config (else the
    one verl printed into the log), lab and plan: the job's (.hydra/config.yaml's lab, plan.json), read into its Run;
    idle_s: seconds since the log last changed, None when it is complete (a stop without error is then a hang or a
    kill); stalls=False: error signatures only (a job known to have finished). No override the job has is suggested."""
    log = Log.of(text)
    run = job_run(with_ray_init(config or printed_config(log), log), lab, plan or {})
    # else an engine or actor that died for no known reason: say so, not "a hang" (grpo_lab/launch/fatal.py)
    found = [d for fn in matchers() for d in fn(log, run)] or engine_died(log)
    if found or not stalls:
        found.sort(key=lambda d: d.line or 0)
    else:
        found = stall(log, run, idle_s, stale_minutes * 60)
    for d in found:
        d.overrides = [o for o in d.overrides if not already_set(run, o)]
    return found


def job_run(verl: dict[str, Any] | None, lab: Lab | None, plan: dict[str, Any]) -> Run:
    """The job's Run as planned, in the user's terms where its card was emulated (RunInfo.job reads the same); a key
    its config does not give is unknown, not verl's default."""
    return Run.build(in_users_terms(verl, plan) or {}, lab, {}, quick=True, verl_defaults=False)


def errors_in(path: str | Path) -> list[Diagnosis]:
    """The error signatures of a job's log so far (no stall reading): what the dead-engine watcher reports."""
    return diagnose(read_log(Path(path)), stalls=False)


def failure_class(diagnoses: Iterable[Diagnosis]) -> str:
    """The sweep summary's status word for a failed job: refused: <rules> / OOM in generation / OOM in training /
    other failure."""
    ds = list(diagnoses)
    for d in ds:
        if d.id == "preflight_refused":
            return "refused: " + d.title[d.title.find("(") + 1:d.title.find(")")]
    for d in ds:  # the first memory error decides
        if SIGNATURES.kind_of(d.id) == "gpu memory":
            return f"OOM in {d.phase}" if d.phase in ("training", "generation") else "OOM (phase unknown)"
    return "other failure"


known("preflight_refused", kind="refusal", phase="preflight")


def refusal(job_dir: str | Path) -> Diagnosis | None:
    """The preflight's refusal of a job (status.json failed before anything started, plan.json's errors), or None:
    its rules and their fixes, not a guess from a log that stops after the preflight report."""
    job_dir = Path(job_dir)
    status, plan = read_json(job_dir / "status.json"), read_json(job_dir / "plan.json")
    errors = [e for e in plan.get("errors") or [] if isinstance(e, dict) and e.get("rule")]
    if status.get("status") != "failed" or not errors or "nothing was started" not in str(status.get("error", "")):
        return None
    rules = list(dict.fromkeys(e["rule"] for e in errors))
    lines = [f"[{e['rule']}] {e.get('message', '')}" + (f"\n  fix: {e['fix']}" if e.get("fix") else "")
             for e in errors]
    fix_all = (plan.get("fix_all") or {}).get("overrides") if (plan.get("fix_all") or {}).get("passes") else None
    # the first fix that is overrides the preflight re-checked (not advice in words, not "no single fix is known")
    first_fix = next((e["fix"].split("  or  ")[0] for e in errors if e.get("fix")
                      and str(e.get("checked", "")).startswith("re-checked: the preflight passes")), "")
    overrides = shlex.split(fix_all or first_fix) if fix_all or first_fix else []
    return Diagnosis(
        id="preflight_refused",
        title=f"Refused by the preflight ({', '.join(rules)}): nothing was started",
        evidence=str(status.get("error")),
        remedy="\n".join(lines + ([f"all together: {fix_all}"] if fix_all else [])
                         + [f"(from {job_dir / 'plan.json'}; check again with preflight.only=true / make plan)"]),
        overrides=overrides)


def diagnose_path(path: str | Path, *, stale_minutes: float = 10.0) -> tuple[Path, list[Diagnosis]]:
    """Diagnose a log file or a job dir (its train.log, with its verl_config.yaml; a refused job: its refusal).
    Returns (log path, diagnoses)."""
    p = Path(path)
    job_dir = p if p.is_dir() else p.parent
    log_path = p / "train.log" if p.is_dir() else p
    refused = refusal(job_dir)
    if refused is not None:
        return log_path, [refused]
    try:
        idle: float | None = time.time() - log_path.stat().st_mtime
    except OSError:
        return log_path, []
    text = read_log(log_path)
    hydra = load_yaml(job_dir / ".hydra" / "config.yaml") or {}
    status = read_json(job_dir / "status.json")
    if not loglines.marker(text) and not (log_path.name == "train.log" and status.get("status")):
        return log_path, [not_a_log(log_path, text)]  # a grpo-lab job's train.log may be empty while it starts
    if status.get("status") in ("failed", "ok") or status.get("ended"):
        idle = None  # the job is over: the log is complete
    error = status.get("error")
    if status.get("status") == "failed" and isinstance(error, str) and error.strip():
        last = error.strip().splitlines()[-1].strip()
        if last not in text:  # the driver's exception, caught after the log's tee ended (runs before it was appended)
            text += "\ngrpo-lab: the job raised (status.json):\n" + error + "\n"
    return log_path, diagnose(text, load_yaml(job_dir / "verl_config.yaml"), lab=Lab.of(hydra.get("lab")),
                              plan=read_json(job_dir / "plan.json"), idle_s=idle, stale_minutes=stale_minutes,
                              stalls=status.get("status") != "ok")


def in_users_terms(config: dict[str, Any] | None, plan: dict[str, Any]) -> dict[str, Any] | None:
    """The job's verl config with the values the user set where an emulated card scaled them (docs/after_run.md)."""
    from grpo_lab.memory.emulate import utilizations
    from grpo_lab.verl_keys import with_value

    emulation = plan.get("emulation") or {}
    if not config or not emulation.get("emulated"):
        return config
    scaled = emulation.get("gpu_memory_utilization") or {}
    for key, _ in list(utilizations(config)):
        if "planned" in scaled.get(key, {}):
            config = with_value(config, key, scaled[key]["planned"])
    return config


NOT_A_LOG = known("not_a_log", kind="input", phase="any")


def not_a_log(path: Path, text: str) -> Diagnosis:
    """What the doctor says of a file that is no verl or grpo-lab log (grpo_lab/loglines.py): that, nothing to try."""
    first = loglines.first_line(text)
    return Diagnosis(
        id=NOT_A_LOG, title=f"{path} is not a verl or grpo-lab log" + ("" if first else " (it is empty)"),
        evidence=f"first line: {first}" if first else "(empty file)",
        remedy=("None of the lines that verl 0.9.1, Ray or run.py always print in a job is in it ("
                + loglines.described() + "), so there is nothing to diagnose and nothing is suggested. Give the "
                "doctor a job's log: make doctor LOG=outputs/runs/<job>/train.log (or the job's folder), or the "
                "console output of a verl run."))


def format_diagnoses(diagnoses: list[Diagnosis], source: str = "") -> str:
    if not diagnoses:
        return f"grpo-lab doctor: no known failure signature in {source or 'the log'}."
    if [d.id for d in diagnoses] == [NOT_A_LOG]:
        d = diagnoses[0]
        return f"grpo-lab doctor: {d.title}; nothing to diagnose.\n  {d.evidence}\n  {d.remedy}"
    head = f"grpo-lab doctor: {len(diagnoses)} finding(s)" + (f" in {source}" if source else "") + ":"
    return "\n".join([head] + [d.format() for d in diagnoses])


def write_diagnosis(job_dir: str | Path) -> list[Diagnosis]:
    """Diagnose a job dir's train.log and write diagnosis.json beside it."""
    job_dir = Path(job_dir)
    _, ds = diagnose_path(job_dir)
    out = {"log": "train.log", "diagnoses": [d.to_dict() for d in ds]}
    facts.atomic_write(job_dir / "diagnosis.json", json.dumps(out, indent=2) + "\n")
    return ds


