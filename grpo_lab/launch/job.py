"""One job as a pipeline of stages, each a small function of what the one before gave:

    prepare(cfg, job) -> Prepared     verl's and lab's dicts (resolved, split) with the job's own values: a sweep
                                      point's checkpoint folder, jobs side by side, the micro-batch settled, the SLURM
                                      job's Ray cluster
      fit(cfg, prepared, job)         preflight.fit (make fit): search settings that fit every phase, print one
                                      command, never launch (grpo_lab/checks/fit.py runs the preflight itself)
    emulate(prepared, job) -> Emulated   the workers' environment, then the one transform for an emulated smaller card
                                      (grpo_lab/checks/emulate.py): the config as planned and as verl gets it (without
                                      emulation both are the same dict)
    check(emulated, prepared, job) -> Checked   side by side, verl's KV cache pinned to the plan's; verl_config.yaml;
                                      the preflight on the config as planned; plan.json; a refusal raises GrpoLabError
      plan(checked, job)              preflight.only: what was planned, nothing started
      train(checked, prepared)        verl's PPO entrypoint, in the SLURM job's Ray cluster if there is one

run.py's Hydra task function calls `launch_job(cfg, cli)` once per Hydra job (one for a run, one per sweep point in
multirun) with the command line it parsed. What a job leaves in its output dir: verl_config.yaml (what verl got),
plan.json (preflight, and the values that differ from verl's defaults), train.log (everything printed), metrics.jsonl
(verl's file logger), status.json (what the sweep's exit code is read from: grpo_lab/launch/outcome.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import os
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from grpo_lab.cli.config import checkpoint_key, split
from grpo_lab.errors import GrpoLabError
from grpo_lab import facts
from grpo_lab.facts import atomic_write, write_json
from grpo_lab.labconf import Lab
from grpo_lab.launch.outcome import NOT_READY_EXIT, REFUSED_EXIT
from grpo_lab.verl_keys import get, put, with_value

if TYPE_CHECKING:
    from grpo_lab.checks.emulate import Emulated
    from grpo_lab.checks.preflight import PreflightReport as Report
    from grpo_lab.cli.overrides import CommandLine
    from grpo_lab.cli.provenance import Layers
    from grpo_lab.launch.slurm import RayNodes

WORKER_ENV = facts.RAY_ENV_VARS  # what verl hands its Ray workers


@dataclass(frozen=True)
class Job:
    """One Hydra job, as the stages see it."""

    dir: Path  # its output folder
    multirun: bool  # a sweep point
    override_dirname: str  # its overrides as one name (a sweep point's checkpoint folder)
    cli: CommandLine | None = None  # the command line run.py parsed; None: composed without it (a test)

    @classmethod
    def current(cls, cli: CommandLine | None = None) -> Job:
        hc = HydraConfig.get()
        return cls(Path(hc.runtime.output_dir), hc.mode == RunMode.MULTIRUN, hc.job.override_dirname, cli)


@dataclass
class Prepared:
    """prepare's output: the composed config as plain dicts, with the job's own values."""

    verl: dict[str, Any]
    lab: Lab
    layers: Layers  # what set each value (plan.json's changed_defaults)
    cluster: RayNodes | None = None  # the Ray cluster of a SLURM job of several nodes (its first node only)

    @property
    def fitting(self) -> bool:
        return bool(self.lab.preflight.fit or self.lab.preflight.fit_write)

    @property
    def plan_only(self) -> bool:
        return self.lab.preflight.only


@dataclass
class Checked:
    """check's output: the preflight's report (it passed) and the config verl gets (as in verl_config.yaml)."""

    report: Report
    verl: dict[str, Any]


def launch_job(cfg: DictConfig, cli: CommandLine | None = None) -> str:
    """One Hydra job through the stages, with its status.json and train.log whatever happens; `cli` is the command
    line run.py parsed. A refusal exits 2 and a plan not ready here 3; a sweep point returns and the sweep goes on."""
    job = Job.current(cli)
    status = JobStatus(job.dir / "status.json")
    try:
        with tee_output(job.dir / "train.log"):
            status.write("running")
            result, ready = run_stages(cfg, job)
        if ready:
            status.write("ok", note=result)
            return result
        status.write("ok", note=result, ready_here=False, exit=NOT_READY_EXIT)
    except GrpoLabError as e:
        status.write("failed", error=str(e), exit=REFUSED_EXIT)
        print(f"\ngrpo-lab: {e}", file=sys.stderr)
        if job.multirun:  # a refusal is no crash: no traceback; the sweep goes on, and exits 2 at its end (outcome.py)
            return "refused"
        raise SystemExit(REFUSED_EXIT) from None
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        status.write("failed", error=error, exit=1)
        # the exception reaches this process after the tee has ended: put it in the log the doctor reads (a Ray task's
        # error, e.g. verl's weight sync raising, was otherwise only on the console and in status.json)
        _append(job.dir / "train.log", "grpo-lab: the job raised:\n" + traceback.format_exc())
        found = _diagnose(job.dir / "train.log")
        if found:
            status.write("failed", error=error, exit=1, diagnosis=[d.to_dict() for d in found])
        raise
    # a plan that holds, not ready to launch here: its own exit code (a sweep's, after the last job: outcome.py)
    if job.multirun:
        return result
    raise SystemExit(NOT_READY_EXIT)


def run_stages(cfg: DictConfig, job: Job) -> tuple[str, bool]:
    """(what the job did, whether it was ready here: False only for a plan of a run that cannot start here)."""
    prepared = prepare(cfg, job)
    if prepared.fitting:
        return fit(cfg, prepared, job), True
    checked = check(emulate(prepared, job), prepared, job)
    if prepared.plan_only:
        return plan(checked, job), checked.report.ready
    return train(checked, prepared), True


# ------------------------------------------------------------------------------------------------------ the stages


def prepare(cfg: DictConfig, job: Job) -> Prepared:
    """The composed config as verl's and lab's plain dicts, with what this job adds: a sweep point's own checkpoint
    folder, how many jobs run side by side, the micro-batch settled, the SLURM job's Ray cluster."""
    from grpo_lab.checks.microbatch import settle
    from grpo_lab.cli.provenance import job_layers
    from grpo_lab.launch.slurm import cluster_for_job

    try:
        verl, lab = split(cfg)
    except MissingMandatoryValue as e:
        raise GrpoLabError(f"a required value is missing: {e.full_key}. Set it on the command line, "
                           f"e.g. python run.py {e.full_key}=...") from None
    except OmegaConfBaseException as e:  # an interpolation that cannot be worked out from the values given
        raise GrpoLabError(f"{e.full_key} cannot be worked out from the values it is made of "
                           f"({str(e).splitlines()[0]}): check those values, or set it on the command line, "
                           f"e.g. python run.py {e.full_key}=...") from None
    if job.multirun:
        # each sweep job its own checkpoints, so that none resumes from a sibling's
        ckpt = os.path.join(get(verl, "trainer.default_local_dir"), checkpoint_key(job.override_dirname))
        put(verl, "trainer.default_local_dir", ckpt)
        # hydra/launcher=side_by_side: up to n_jobs jobs share the GPUs and the host (rule side_by_side_jobs)
        lab.side_by_side_jobs = side_by_side_jobs(HydraConfig.get().launcher)
    layers = job_layers(job.cli.env_names if job.cli is not None else None)
    # the user's micro-batch size wins over our dynamic batching default (grpo_lab/checks/microbatch.py; rule
    # micro_batch_explicit reports it)
    lab.micro_batch = settle(verl, layers)
    # the first node of a SLURM job of several nodes starts a Ray cluster across them (train runs verl inside it) and
    # the job joins it by address (grpo_lab/launch/slurm.py); None everywhere else
    cluster = cluster_for_job(verl, lab)
    return Prepared(verl, lab, layers, cluster)


def fit(cfg: DictConfig, prepared: Prepared, job: Job) -> str:
    """make fit (grpo_lab/checks/fit.py): settings that fit every phase, searched with the preflight; never launches."""
    from grpo_lab.checks.fit import fit_job

    return fit_job(cfg, prepared.verl, prepared.lab, job.dir)


def emulate(prepared: Prepared, job: Job) -> Emulated:
    """The config as the preflight plans it and as verl gets it: the workers' environment added, then the one
    transform for an emulated smaller card (grpo_lab/checks/emulate.py; without emulation both are the same dict).
    Input emulation cannot take is refused here, before anything is written."""
    from grpo_lab.checks.emulate import EmulationError
    from grpo_lab.checks.emulate import emulate as for_card

    config = with_value(prepared.verl, WORKER_ENV, worker_env(prepared.verl, prepared.lab, job.dir))
    try:
        return for_card(config, prepared.lab, os.environ)
    except EmulationError as e:
        raise GrpoLabError(str(e)) from None


def check(emulated: Emulated, prepared: Prepared, job: Job) -> Checked:
    """The preflight on the config as planned; verl_config.yaml (what verl gets) and plan.json (what was checked, and
    the values that differ from verl's defaults) on record, the report printed. Refused: GrpoLabError."""
    from grpo_lab.checks.kv_pin import pin_side_by_side
    from grpo_lab.checks.readiness import not_ready_here

    planned, lab = emulated.planned, prepared.lab
    # side by side (grpo_lab/checks/kv_pin.py): each job's vLLM KV cache pinned to the plan's (the user's pin wins)
    verl, kv_pin = pin_side_by_side(planned, emulated.verl, lab, os.environ)
    _write_yaml(job.dir / "verl_config.yaml", verl)
    # imported after the pin, as it always was: the rules run in the order their modules were first imported, and the
    # pin's memory plan imports the memory rules (side by side their problems and notes come first)
    from grpo_lab.checks.preflight import run_preflight

    only = prepared.plan_only
    report = run_preflight(planned, lab, launching=not only)
    # what this machine lacks: refused when launching; a plan that holds gets "not ready to launch here"
    report.not_ready = not_ready_here(planned, lab, os.environ, plan_only=only)
    report.fit_args = own_args(job.multirun, job.cli)  # for `make fit ARGS="..."` when no fix fits every phase
    plan_json = _plan_record(report, verl, emulated, kv_pin, prepared, job)
    write_json(job.dir / "plan.json", plan_json)
    print(report.format())
    print(f"grpo-lab: {len(plan_json['changed_defaults'])} value(s) differ from verl's defaults, each with verl's "
          f"value, ours and what set it: \"changed_defaults\" in {job.dir}/plan.json")
    if not report.ok:
        n = len(report.errors) + (len(report.not_ready) if report.launching else 0)
        raise GrpoLabError(f"{n} problem(s) above; nothing was started (plan: {job.dir}/plan.json).")
    return Checked(report, verl)


def plan(checked: Checked, job: Job) -> str:
    """preflight.only: the plan is on record; say so, and what starts it when it can start here."""
    report = checked.report
    print(f"grpo-lab: preflight only: plan written to {job.dir}/plan.json; nothing was started.")
    if not report.ready:
        print(f"grpo-lab: the plan holds, but the run cannot start on this machine: {len(report.not_ready)} "
              f"thing(s) under \"Not ready to launch here\" above (exit code {NOT_READY_EXIT}).")
    elif not job.multirun:
        print(f"next: {next_command(job.cli)}")
    return "planned"


def train(checked: Checked, prepared: Prepared) -> str:
    """verl's PPO entrypoint with the checked config (inside the SLURM job's Ray cluster, when there is one)."""
    with prepared.cluster.running() if prepared.cluster else contextlib.nullcontext():
        run_verl(checked.verl)
    return "trained"


# ------------------------------------------------------------------------------------------------ what they use


def _plan_record(report: Report, verl: dict[str, Any], emulated: Emulated, kv_pin: dict[str, Any] | None,
                 prepared: Prepared, job: Job) -> dict[str, Any]:
    """plan.json: the preflight's report, the values that differ from verl's defaults (of what verl gets, with what
    set them), the values given twice, the micro-batch settled, the emulation."""
    from grpo_lab.checks.emulate import mark_scaled
    from grpo_lab.checks.kv_pin import mark_changed
    from grpo_lab.cli.provenance import for_job

    plan_json = report.to_json()
    plan_json["changed_defaults"] = changed = for_job(verl, multirun=job.multirun, layers=prepared.layers)
    mark_changed(changed, kv_pin)
    # a value given twice (grpo_lab/cli/overrides.py warned on the console before composing): which one wins, on record
    twice = job.cli.warnings if job.cli is not None else []
    plan_json["warnings"] = list(plan_json.get("warnings", [])) + [
        {"rule": "key_given_twice", "message": w, "fix": ""} for w in twice]
    if prepared.lab.micro_batch:
        plan_json["micro_batch"] = prepared.lab.micro_batch
    if emulated.info:  # what vLLM and torch really get, and which values emulation scaled
        plan_json["emulation"] = emulated.info
        mark_scaled(changed, emulated.info)
    return plan_json


def side_by_side_jobs(launcher: Any) -> int:
    """How many jobs of this sweep may run at once: Hydra's joblib launcher's n_jobs (conf/hydra/launcher/side_by_side.yaml;
    joblib's -1 = one a CPU core), 1 for a launcher that runs one job after another or each on its own machines."""
    from grpo_lab.cli.apply import jobs_at_once

    try:
        if "JoblibLauncher" not in str(launcher.get("_target_", "")):
            return 1
        return jobs_at_once(launcher.get("n_jobs") or 1)
    except (AttributeError, TypeError, ValueError):
        return 1


def _append(path: Path, text: str) -> None:
    try:
        with path.open("a", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    except OSError:
        pass  # a log that cannot be written must not hide the job's own error


def next_command(cli: CommandLine | None) -> str:
    """The command that starts what `preflight.only=true` checked: this command line without it."""
    import shlex

    args = cli.args if cli is not None else list(HydraConfig.get().overrides.task)
    keep = [a for a in args if a.split("=", 1)[0].lstrip("+") != "preflight.only"]
    return "python run.py " + " ".join(shlex.quote(a) for a in keep) if keep else "python run.py"


def own_args(multirun: bool, cli: CommandLine | None) -> list[str]:
    """The user's own overrides of this job, as typed (a sweep job: its own point), without what only launches or
    places it (preflight.only, Hydra's flags and hydra.* settings)."""
    hc = HydraConfig.get()
    args = list(hc.overrides.task) if multirun or cli is None else list(cli.args)
    skip = ("preflight.only", "preflight.fit", "preflight.fit_write", "preflight.fit_overwrite")
    return [a for a in args if not a.startswith("-") and a.split("=", 1)[0].lstrip("+~") not in skip
            and not a.lstrip("+~").startswith(("hydra.", "hydra/"))]


def worker_env(verl: dict[str, Any], lab: Lab, job_dir: Path) -> dict[str, Any]:
    """The environment of verl's Ray workers (Ray wants string values): the job's own, with ours added where the
    user set nothing."""
    env = dict(get(verl, WORKER_ENV) or {})
    ours = {"VERL_FILE_LOGGER_PATH": str(job_dir.resolve() / "metrics.jsonl")}
    if "wandb" in (get(verl, "trainer.logger") or []):
        ours["WANDB_DIR"] = str(job_dir.resolve())
        ours["WANDB_MODE"] = os.environ.get("WANDB_MODE") or str(lab.wandb.mode or "offline")
    if importlib.util.find_spec("flashinfer") is None and "VLLM_USE_FLASHINFER_SAMPLER" not in os.environ:
        # vLLM's sampler imports flashinfer unless told not to: "No module named 'flashinfer'" at engine start
        ours["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    for k, v in ours.items():
        env.setdefault(k, v)
    return env


def run_verl(verl: dict[str, Any]) -> None:
    """verl's own main_ppo.main, minus Hydra: validate, then run_ppo with the V1 (or legacy) task runner."""
    import ray
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    config = OmegaConf.create(verl)
    OmegaConf.set_struct(config, True)  # as Hydra hands it to verl's own main
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    if config.trainer.use_v1:
        runner = TaskRunnerV1
    else:
        from verl.trainer.main_ppo_v0 import TaskRunner as runner
    from grpo_lab.after_run.doctor import ProgressWatchdog, errors_in
    from grpo_lab.launch.fatal import EngineDied, FatalWatch, TrackedRunner

    log = Path(os.environ["GRPO_LAB_LOG"]) if os.environ.get("GRPO_LAB_LOG") else None
    watchdog = ProgressWatchdog(log) if log else None
    # a fatal engine / actor line in the log: verl would wait for ever; kill its TaskRunner (grpo_lab/launch/fatal.py)
    tracked = TrackedRunner(runner)
    fatal = FatalWatch(log, stop=tracked.kill, diagnose=errors_in) if log else None
    try:
        if watchdog:
            watchdog.start()
        if fatal:
            fatal.start()
        run_ppo(config, task_runner_class=tracked)
    except BaseException:
        if fatal and fatal.fired and fatal.fired.message:  # stopped by the watcher: say why, not "killed by ray.kill"
            raise EngineDied(fatal.fired.message) from None
        raise
    finally:
        if fatal:
            fatal.stop()
        if watchdog:
            watchdog.stop()
        if ray.is_initialized():
            ray.shutdown()


def _diagnose(log: Path) -> list[Any]:
    """Print the doctor's diagnosis of a failed job's log; the diagnoses (for status.json)."""
    try:
        from grpo_lab.after_run.doctor import diagnose_path, format_diagnoses

        log_path, found = diagnose_path(log)
        print(format_diagnoses(found, str(log_path)), file=sys.stderr)
        return found
    except Exception as e:  # a diagnosis must never hide the real error
        print(f"grpo-lab: (no diagnosis: {e})", file=sys.stderr)
        return []


class JobStatus:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.started = time.time()

    def write(self, status: str, **extra: Any) -> None:
        now = time.time()
        data = {
            "status": status,
            "started": dt.datetime.fromtimestamp(self.started).isoformat(timespec="seconds"),
            "ended": None if status == "running" else dt.datetime.fromtimestamp(now).isoformat(timespec="seconds"),
            "wall_s": round(now - self.started, 1),
            "error": None,
            "exit": 0 if status == "ok" else None,
            # who runs it: a "running" job whose process is gone was killed without a word (doctor.gone_running)
            "host": socket.gethostname(),
            "pid": os.getpid(),
            **extra,
        }
        write_json(self.path, data)


def _write_yaml(path: Path, data: Any) -> None:
    # libyaml's emitter when PyYAML has it: the pure-Python one takes ~0.1 s for verl's config
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    atomic_write(path, yaml.dump(data, Dumper=dumper, sort_keys=False))


@contextlib.contextmanager
def tee_output(log_path: Path) -> Iterator[None]:
    """Copy everything written to this process's stdout and stderr (Ray's forwarded worker output too) to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    tee = subprocess.Popen(["tee", "-a", str(log_path)], stdin=subprocess.PIPE, stdout=saved_out)
    assert tee.stdin is not None
    os.dup2(tee.stdin.fileno(), 1)
    os.dup2(tee.stdin.fileno(), 2)
    os.environ["GRPO_LAB_LOG"] = str(log_path)
    # each line reaches the log when it is printed (Ray forwards the workers' lines without flushing): the watchers
    # read the log while the job runs (grpo_lab/launch/fatal.py, doctor.ProgressWatchdog)
    buffered = [(f, f.line_buffering) for f in (sys.stdout, sys.stderr) if hasattr(f, "reconfigure")]
    for f, _ in buffered:
        f.reconfigure(line_buffering=True)
    try:
        yield
    finally:
        for f, was in buffered:
            f.reconfigure(line_buffering=was)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.close(saved_out)
        os.close(saved_err)
        tee.stdin.close()
        os.environ.pop("GRPO_LAB_LOG", None)
        try:
            tee.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a leftover child still holds the pipe
            tee.kill()
