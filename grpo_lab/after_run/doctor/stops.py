"""How a job stopped when no signature says why: a log that ends in a Python exception, a log that ends without an
error (a hang, a kill, a start-up that never finished), an engine or Ray actor that died of something unknown, a
"running" job whose process is gone."""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
from typing import Any

from grpo_lab import facts
from grpo_lab.after_run.doctor.logread import (
    END_MARKERS,
    UNITS,
    Diagnosis,
    Log,
    cpus_needed,
    env_override,
    storage_units,
)
from grpo_lab.after_run.doctor.signatures import TRACEBACK, FatalLine, fatal_line, known, nccl_diagnosis
from grpo_lab.loglines import EXCEPTION_LINE, FRAME, strip
from grpo_lab.memory.run import Run
from grpo_lab.memory.settings import as_int

# the diagnoses of this module: no matcher finds them, they come from where the log stops or from a dead engine
# (a stop at NCCL initialisation is the nccl_hang signature's)
known("ray_cpu_budget_hang", kind="ray", phase="start-up")
known("stopped_without_error", kind="stop", phase="any")
known("stopped_by_user", kind="stop", phase="any")
known("job_raised", kind="crash", phase="any")
# marked fatal: the lines of vLLM 0.24, SGLang and Ray 2.60 after which verl 0.9.1 waits for ever (launch/fatal.py)
ENGINE_DIED = known("engine_died", kind="engine", phase="rollout", fatal=(
    FatalLine(re.compile(r"^EngineCore failed to start\."), "vLLM's engine failed to start"),
    FatalLine(re.compile(r"^RuntimeError: Engine core initialization failed\b"), "vLLM's engine failed to start"),
    FatalLine(re.compile(r"^EngineCore encountered a fatal error\."), "vLLM's engine died"),
    FatalLine(re.compile(r"^(?:[\w.]+\.)?(?:RayTaskError\()?EngineDeadError\b"), "vLLM's engine is dead"),
    FatalLine(re.compile(r"^RuntimeError: Worker failed with error '"), "a vLLM worker failed its engine's call"),
    FatalLine(re.compile(r"^Worker proc \S+ died unexpectedly"), "a vLLM worker process died"),
    FatalLine(re.compile(r"^WorkerProc failed(?: to start)?\.$"), "a vLLM worker process failed"),
    FatalLine(re.compile(r"^Scheduler hit an exception"), "SGLang's scheduler died"),
    FatalLine(re.compile(r"^Received sigquit from a child process"), "an SGLang process died"),
    # the end of the traceback vLLM logs when a call to a worker raised ("WorkerProc hit an exception.")
    FatalLine(EXCEPTION_LINE, "a vLLM worker's call raised", source="multiproc_executor.py")))
RAY_ACTOR_DIED = known("ray_actor_died", kind="ray", phase="any", fatal=(
    FatalLine(re.compile(r"^(?:ray\.exceptions\.)?(?:RayTaskError\()?(?:ActorDiedError|RayActorError)\)?: The actor "
                         r"died"), "a Ray actor of verl's died"),))

# ---------------------------------------------------------------------------------------------------------------------
# silent stops: where did the log stop?

# Ray's sigterm_handler turns SIGTERM (and SIGINT) into SystemExit(signum): what the unwinding raises after it is the
# kill's aftermath, not a crash
_SIGNAL_EXIT = re.compile(r"^SystemExit: (?:15|2)$")
_KILLED = re.compile(r"SIGTERM received|^KeyboardInterrupt|Command exited with non-zero status|^Terminated|"
                     r"Terminated with signal|received signal|SIGINT|^\^C|" + _SIGNAL_EXIT.pattern)
NOISE = re.compile(r"SIGTERM received|^Command exited with non-zero status|^WALL |The autoscaler failed|"
                   r"^Terminated|^\s*@\s+0x|logging\.cc:\d+|^PC: @|autoscaler/_private|monitor\.run\(\)|"
                   r"self\._run\(\)|AUTOSCALER_UPDATE_INTERVAL_S|^\s*$|\(autoscaler \+|grpo-lab watchdog|"
                   r"resource request cannot be scheduled|Tip: use `ray status`|KeyboardInterrupt|"
                   r"^grpo-lab: the job raised:")
_USER_STOP = re.compile(r"^KeyboardInterrupt|^\^C|SIGINT|^SystemExit: 2$")
_CONFIG_PRINT = re.compile(r"^ray init kwargs:|^\{'actor_rollout_ref'")
_AFTER_CONFIG = re.compile(r"Using dataset class|dataset len|Total training steps|create worker group|"
                           r"colocated worker base class")
_WORKERS = re.compile(r"Before FSDP|NCCL version|init_process_group|\[c10d\]|Loading weights|contains [\d.]+[MBK]? ?"
                      r"parameters")
_WORKERS_DONE = re.compile(r"After FSDP|engine initialized|init_model|LLMServerManager|vLLMHttpServer")
_UNSCHEDULABLE = re.compile(r"resource request cannot be scheduled right now")


def _cpu_budget_hang(run: Run, evidence: str, line: int | None, where: str) -> Diagnosis:
    need, have = cpus_needed(run), run.cfg.ray_init.num_cpus
    gpus, v1, units = run.cfg.trainer.n_gpus_per_node, run.cfg.trainer.use_v1, storage_units(run)
    units_fit = have - facts.ray_cpus_needed(int(gpus), True, 0) if need and have is not None and v1 else None
    overrides = [f"ray_kwargs.ray_init.num_cpus={need}"] if need else []
    if units_fit is not None and 1 <= units_fit < int(units):
        overrides.append(f"{UNITS}={units_fit}")
    unknown = ", ".join(k for k, x in (("trainer.n_gpus_per_node", gpus), ("trainer.use_v1", v1), (UNITS, units))
                        if x is None)
    asks = (f"{facts.ray_cpus_formula(int(gpus), bool(v1), int(units or 0))} = {need}" if need else
            f"3 per GPU + 2 + the TransferQueue storage units ({unknown}: not in the job's config)")
    return Diagnosis(
        id="ray_cpu_budget_hang",
        title="Silent hang: Ray has too few CPUs, a placement group never becomes ready",
        evidence=evidence, line=line,
        remedy=(f"The log stops {where}, with no error and no `step:` line. verl's V1 trainer asks Ray for "
                f"{asks} CPUs, and Ray was given {have if have is not None else 'fewer'} "
                "(ray_kwargs.ray_init.num_cpus), so it waits for ever. Give Ray enough CPUs if the machine has the "
                "cores, or use fewer TransferQueue storage units so the job fits the cores you have "
                "(the legacy trainer, trainer.use_v1=false, needs no TransferQueue)."),
        overrides=overrides)


# what may follow a traceback's exception line at the end of a log: its own indented lines, Hydra's tail, our notes
_AFTER_EXCEPTION = re.compile(r"^\s|^Set the environment variable HYDRA_FULL_ERROR|^Error executing job|^grpo-lab")


def _frame(m: re.Match[str]) -> str:
    path = m.group(1).split("/site-packages/")[-1].removeprefix(f"{facts.ROOT}/")
    return f"{path}:{m.group(2)} in {m.group(3)}"


def raised(log: Log) -> list[Diagnosis]:
    """A log whose last words are a Python traceback (not Ctrl+C's, not an exit): the exception and where it was
    raised, never a hang's diagnosis."""
    last = next((i for i in range(len(log.clean) - 1, -1, -1) if log.clean[i].strip()
                 and not NOISE.search(log.clean[i]) and not _AFTER_EXCEPTION.search(log.clean[i])), None)
    if last is None or not EXCEPTION_LINE.match(log.clean[last].strip()) \
            or re.match(r"(?:[\w.]+\.)?(?:KeyboardInterrupt|SystemExit)\b", log.clean[last].strip()) \
            or any(_SIGNAL_EXIT.match(log.clean[j].strip()) for j in range(max(0, last - 400), last)):
        return []
    frames = [m for j in range(last - 1, max(-1, last - 400), -1) if (m := FRAME.match(log.clean[j]))]
    if not frames or log.first(TRACEBACK) is None:
        return []
    exc = log.evidence(last)
    at = _frame(frames[0])
    own = next((m for m in frames if _own(m)), None)
    where = at + (f", called from {_frame(own)}" if own is not None and own is not frames[0] else "")
    return [Diagnosis(
        id="job_raised", title=f"The job raised {exc.split(':', 1)[0]} ({at})", evidence=exc, line=last + 1,
        remedy=(f"The log ends in this Python exception, raised at {where} (the traceback above it in the log): the "
                "job crashed, it did not hang, so nothing here points at Ray's CPUs or NCCL. No known signature "
                "matches it and nothing is suggested blindly: the exception's text and that frame say what to "
                "change; a config is checked without starting anything with preflight.only=true (make plan)."))]


def _own(m: re.Match[str]) -> bool:
    return not re.search(r"/site-packages/|/python3\.\d+/", m.group(1)) or "/site-packages/verl/" in m.group(1)


def _user_stop(log: Log, kill_i: int, steps: list[int]) -> Diagnosis:
    """Ctrl+C: where the job was (the innermost frame of grpo-lab's or verl's above the KeyboardInterrupt)."""
    frames = [m for j in range(kill_i, max(-1, kill_i - 80), -1) if (m := FRAME.match(log.clean[j]))]
    own = next((m for m in frames if _own(m)), None)
    at = f" in {_frame(own)}" if own else ""
    when = f"after step {max(steps)}" if steps else "before the first step"
    again = "trainer.resume_mode=auto resumes it from the last checkpoint." if steps else "run it again when ready."
    return Diagnosis(
        id="stopped_by_user", title=f"Stopped by the user (Ctrl+C) {when}" + (at and "," + at),
        evidence=log.evidence(kill_i), line=kill_i + 1,
        remedy=f"The job was interrupted (KeyboardInterrupt){at}: it did not fail, so nothing is suggested; {again}")


def stall(log: Log, run: Run, idle_s: float | None, stale_s: float) -> list[Diagnosis]:
    """A log that ends with no error: hung (and killed), still running, or finished; one that ends in a Python
    exception is no hang (raised)."""
    steps = log.steps()
    total = as_int(run.cfg.trainer.total_training_steps)
    if log.first(END_MARKERS) is not None or (total > 0 and steps and max(steps) >= total):
        return []  # it finished
    crashed = raised(log)  # a process that raised is over, however recent its log
    if crashed:
        return crashed
    kill_i = log.first(_KILLED)
    killed = kill_i is not None
    if not killed and idle_s is not None and idle_s < stale_s:
        return []  # still moving
    cut = len(log.clean) if kill_i is None else kill_i
    if kill_i is not None and log.clean[kill_i].startswith(("KeyboardInterrupt", "SystemExit")):
        cut = next((j for j in range(kill_i, max(-1, kill_i - 80), -1)  # its traceback is not the job's
                    if "Traceback (most recent call last)" in log.clean[j]), kill_i)
    last = next((i for i in range(cut - 1, -1, -1) if not NOISE.search(log.clean[i])), None)  # the last meaningful
    ev = log.evidence(last) if last is not None else "(empty log)"
    line = last + 1 if last is not None else None
    gone = ("then nothing until it was killed" if killed else
            f"then nothing for {idle_s / 60:.0f} min" if idle_s is not None else "then the log ends")
    cfg_i = max(log.find(_CONFIG_PRINT) or [-1])
    unsched = log.first(_UNSCHEDULABLE)
    if unsched is not None and not steps:
        return [_cpu_budget_hang(run, log.evidence(unsched), unsched + 1,
                                 "with Ray saying a resource request cannot be scheduled")]
    if cfg_i >= 0 and not steps:
        after = log.clean[cfg_i + 1:]
        if not any(_AFTER_CONFIG.search(s) or _WORKERS.search(s) or _WORKERS_DONE.search(s) for s in after):
            return [_cpu_budget_hang(run, ev, line, f"right after the config print ({gone})")]
        if not any(_WORKERS.search(s) or _WORKERS_DONE.search(s) for s in after):
            return [_cpu_budget_hang(run, ev, line, f"after the datasets, before any worker started ({gone})")]
        nccl_i = max(log.find(_WORKERS) or [-1])
        if nccl_i >= 0 and not any(_WORKERS_DONE.search(s) for s in log.clean[nccl_i:]):
            return [nccl_diagnosis(run, ev, line,
                                   f"at initialisation (the workers started, FSDP never finished; {gone})")]
    if kill_i is not None and _USER_STOP.search(log.clean[kill_i]):
        return [_user_stop(log, kill_i, steps)]
    if steps:
        title = f"Stopped after step {max(steps)} with no error"
        remedy = (f"The log shows step {max(steps)}, {gone}. If it was killed on purpose (time limit, Ctrl+C) "
                  "resume it (trainer.resume_mode=auto resumes from the last checkpoint). If it stopped moving "
                  "first: on GeForce cards a hang in NCCL (weight sync, collectives) is the usual cause: "
                  "NCCL_P2P_DISABLE=1; a very long generation looks the same: watch nvtop.")
    else:
        title = "Stopped before the first step with no error"
        remedy = (f"The last line is above, {gone}. Hang causes at start: too few Ray CPUs (3 per GPU + 2 + the "
                  "TransferQueue storage units: ray_kwargs.ray_init.num_cpus), NCCL init on GeForce cards "
                  "(NCCL_P2P_DISABLE=1). vLLM's start alone takes minutes: 88 s from its server process to serving, "
                  "107 s after the actor was ready, for a tiny model on an H200 (benchmarks/gpu/results/2026-12-02-b/"
                  "phases.txt).")
    need = None if steps else cpus_needed(run)  # before the first step, Ray's CPUs are a suspect too
    overrides = ([f"ray_kwargs.ray_init.num_cpus={need}"] if need else []) + [env_override("NCCL_P2P_DISABLE", "1")]
    return [Diagnosis(id="stopped_without_error", title=title, evidence=ev, line=line, remedy=remedy,
                      overrides=overrides)]


# ---------------------------------------------------------------------------------------------------------------------
# an engine or actor that died, a process that is gone

# exception lines that only say that something else failed: the cause is another line
_WRAPPERS = re.compile(r"Engine core initialization failed|Worker failed with error|EngineDeadError|ActorDiedError|"
                       r"RayActorError|RayTaskError|WorkerProc initialization failed|EngineGenerateError|"
                       r"^KeyboardInterrupt|^SystemExit")


def root_cause(clean: list[str], i: int) -> tuple[str, str]:
    """(the exception that caused the fatal line at i, its innermost frame "file:line in fn" or "")."""
    order = list(range(i, min(len(clean), i + 80))) + list(range(i - 1, max(-1, i - 150), -1))
    for r in order:
        s = clean[r].strip()
        if EXCEPTION_LINE.match(s) and not _WRAPPERS.search(s):
            fm = next((m for j in range(r - 1, max(-1, r - 40), -1) if (m := FRAME.match(clean[j]))), None)
            path = fm.group(1) if fm else ""
            short = path[path.find("/vllm/") + 1:] if "/vllm/" in path else path
            frame = f"{short}:{fm.group(2)} in {fm.group(3)}" if fm else ""
            return (s if len(s) <= 200 else s[:197] + "..."), frame
    return "", ""


def engine_died(log: Log) -> list[Diagnosis]:
    """A log with a fatal line (grpo_lab/launch/fatal.py) that no signature explains: which engine or actor died, the
    first error behind it, and that nothing is suggested blindly."""
    hit = next(((i, found) for i, raw in enumerate(log.raw) if (found := fatal_line(raw))), None)
    if hit is None:
        return []
    i, (sid, label) = hit
    clean = [strip(x)[0] for x in log.raw]
    root, frame = root_cause(clean, i)
    cause = f"{root} at {frame}" if root and frame else root
    remedy = (f"{label}: verl 0.9.1 restarts neither its rollout engine nor its Ray actors and has no time-out "
              f"while it waits for them, so such a job hangs; grpo-lab stops it within 30 s of this line "
              f"(status.json failed). The cause is the first error above it in the log"
              + (f": {cause}" if cause else "") + ".")
    if "/lora/" in frame:
        remedy += (" It failed in vLLM's LoRA manager: seen on the GPU test machine when the adapter verl handed "
                   "to vLLM's add_lora held no LoRA weights (SmolLM2, layered_summon=false, "
                   "load_format=safetensors: StopIteration in _create_merged_loras_inplace).")
    return [Diagnosis(id=RAY_ACTOR_DIED if sid == RAY_ACTOR_DIED else ENGINE_DIED,
                      title=f"{label}" + (f": {root}" if root else "") + (f" ({frame})" if frame else ""),
                      evidence=clean[i].strip()[:300], line=i + 1,
                      phase=None if sid == RAY_ACTOR_DIED else "generation", remedy=remedy)]

def gone_running(status: dict[str, Any]) -> str | None:
    """Why a status.json that says "running" is not true any more (a killed job never writes its end), or None when
    it may be: docs/after_run.md."""
    if status.get("status") != "running":
        return None
    pid, host = status.get("pid"), status.get("host")
    if not isinstance(pid, int) or not host or host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"its process (pid {pid} on {host}) is gone without writing an end"
    except PermissionError:
        pass  # exists, another user's
    started = status.get("started")
    try:
        import psutil  # Ray's dependency; without it only a vanished pid counts

        born = psutil.Process(pid).create_time()
        if started and born > dt.datetime.fromisoformat(str(started)).timestamp() + 60:
            return (f"its process (pid {pid} on {host}) is gone without writing an end (the pid now belongs to a "
                    "later process)")
    except Exception:  # no psutil, or the process ended meanwhile: the pid check above stands
        pass
    return None

