"""One job as a pipeline of stages, each a small function of what the one before gave:

    prepare(cfg, job) -> Prepared                 the job's Run (its settings and plans, built once: memory/run.py)
                                                  and the config verl gets (emulated card, KV cache pinned)
      fit(cfg, prepared, job)                     preflight.fit (make fit): search, print one command, never launch
    check(prepared, job) -> Checked               verl_config.yaml, the preflight on the Run, plan.json;
                                                  a refusal raises
      plan(checked, job)                          preflight.only: what was planned, nothing started
      train(checked, prepared)                    verl's PPO entrypoint

run.py's Hydra task function calls `launch_job(cfg, cli)` once per Hydra job (one per sweep point in multirun).
Each stage in full, and what a job leaves in its output dir: docs/launch.md.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from grpo_lab.errors import GrpoLabError
from grpo_lab.facts import atomic_write, write_json
from grpo_lab.launch.outcome import NOT_READY_EXIT, REFUSED_EXIT
from grpo_lab.launch.prepare import Job, Prepared, prepare

if TYPE_CHECKING:
    from grpo_lab.checks.preflight import PreflightReport as Report
    from grpo_lab.cli.overrides import CommandLine


@dataclass
class Checked:
    """check's output: the preflight's report (it passed) and the config verl gets (as in verl_config.yaml)."""

    report: Report
    verl: dict[str, Any]


def launch_job(cfg: DictConfig, cli: CommandLine | None = None, doctor: Any = None) -> str:
    """One Hydra job through the stages, with its status.json and train.log whatever happens; `cli` is the command
    line run.py parsed, `doctor` what reads a failed job's log (Job.doctor). A refusal exits 2 and a plan not ready
    here 3; a sweep point returns and the sweep goes on."""
    job = Job.current(cli, doctor)
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
        found = _diagnose(job.dir / "train.log", job.doctor)
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
    preflight = prepared.run.lab.preflight
    if preflight.fit or preflight.fit_write:
        return fit(cfg, prepared, job), True
    checked = check(prepared, job)
    if preflight.only:
        return plan(checked, job), checked.report.ready
    return train(checked, prepared, job), True


# ------------------------------------------------------------------------------------------------------ the stages


def fit(cfg: DictConfig, prepared: Prepared, job: Job) -> str:
    """make fit (grpo_lab/checks/fit.py): settings that fit every phase, searched with the preflight; never launches."""
    from grpo_lab.checks.fit import fit_job

    return fit_job(cfg, prepared.run, job.dir)


def check(prepared: Prepared, job: Job) -> Checked:
    """The preflight on the job's Run; verl_config.yaml (what verl gets) and plan.json (what was checked, and the
    values that differ from verl's defaults) on record, the report printed. Refused: GrpoLabError."""
    run, verl = prepared.run, prepared.verl
    # libyaml's emitter when PyYAML has it: the pure-Python one takes ~0.1 s for verl's config
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    atomic_write(job.dir / "verl_config.yaml", yaml.dump(verl, Dumper=dumper, sort_keys=False))
    from grpo_lab.checks.plan_text import console
    from grpo_lab.checks.preflight import not_ready_here, run_preflight

    only = run.lab.preflight.only
    report = run_preflight(run, launching=not only)
    # what this machine lacks: refused when launching; a plan that holds gets "not ready to launch here"
    report.not_ready = not_ready_here(run, plan_only=only)
    report.fit_args = own_args(job.multirun, job.cli)  # for `make fit ARGS="..."` when no fix fits every phase
    plan_json = _plan_record(report, prepared, job)
    write_json(job.dir / "plan.json", plan_json)
    changed = len(plan_json["changed_defaults"])
    print(console(report, job.dir, changed, run.lab.preflight.verbose, job.multirun and only))
    if not report.ok:
        n = len(report.errors) + (len(report.not_ready) if report.launching else 0)
        raise GrpoLabError(f"{n} problem(s) above; nothing was started (plan: {job.dir}/plan.json).")
    return Checked(report, verl)


def plan(checked: Checked, job: Job) -> str:
    """preflight.only: the plan is on record; say so, and what starts it when it can start here."""
    report = checked.report
    if job.multirun:  # a sweep's plan: check printed its line
        return "planned"
    written = f"grpo-lab: preflight only: plan written to {job.dir}/plan.json; nothing was started"
    if not report.ready:
        print(f"{written}; the plan holds, but the run cannot start on this machine: {len(report.not_ready)} "
              f"thing(s) under \"Not ready to launch here\" above (exit code {NOT_READY_EXIT}).")
    else:
        print(f"{written}.\nnext: {next_command(job.cli)}")
    return "planned"


def train(checked: Checked, prepared: Prepared, job: Job) -> str:
    """verl's PPO entrypoint with the checked config (inside the SLURM job's Ray cluster, when there is one)."""
    with prepared.cluster.running() if prepared.cluster else contextlib.nullcontext():
        run_verl(checked.verl, job.doctor)
    return "trained"


# ------------------------------------------------------------------------------------------------ what they use


def _plan_record(report: Report, prepared: Prepared, job: Job) -> dict[str, Any]:
    """plan.json: the preflight's report, the values that differ from verl's defaults (prepare's: of what verl gets,
    with what set them), the values given twice, the micro-batch settled, the emulation."""
    lab = prepared.run.lab
    plan_json = report.to_json()
    plan_json["changed_defaults"] = list(prepared.changed)
    # a value given twice (grpo_lab/cli/overrides.py warned on the console before composing): which one wins, on record
    twice = job.cli.warnings if job.cli is not None else []
    plan_json["warnings"] = list(plan_json.get("warnings", [])) + [
        {"rule": "key_given_twice", "message": w, "fix": ""} for w in twice]
    if lab.micro_batch:
        plan_json["micro_batch"] = lab.micro_batch
    if prepared.emulation:  # what vLLM and torch really get, and which values emulation scaled
        plan_json["emulation"] = prepared.emulation
    return plan_json


def _append(path: Path, text: str) -> None:
    # a log that cannot be written must not hide the job's own error
    with contextlib.suppress(OSError), path.open("a", encoding="utf-8") as f:
        f.write(text if text.endswith("\n") else text + "\n")


def next_command(cli: CommandLine | None) -> str:
    """The command that starts what `preflight.only=true` checked: this command line without it (and verbose)."""
    import shlex

    args = cli.args if cli is not None else list(HydraConfig.get().overrides.task)
    keep = [a for a in args if a.split("=", 1)[0].lstrip("+") not in ("preflight.only", "preflight.verbose")]
    return "python run.py " + " ".join(shlex.quote(a) for a in keep) if keep else "python run.py"


def own_args(multirun: bool, cli: CommandLine | None) -> list[str]:
    """The user's own overrides of this job, as typed (a sweep job: its own point), without what only launches or
    places it (preflight.only, Hydra's flags and hydra.* settings)."""
    hc = HydraConfig.get()
    args = list(hc.overrides.task) if multirun or cli is None else list(cli.args)
    skip = ("preflight.only", "preflight.verbose", "preflight.fit", "preflight.fit_write", "preflight.fit_overwrite")
    return [a for a in args if not a.startswith("-") and a.split("=", 1)[0].lstrip("+~") not in skip
            and not a.lstrip("+~").startswith(("hydra.", "hydra/"))]


def run_verl(verl: dict[str, Any], doctor: Any = None) -> None:
    """verl's own main_ppo.main, minus Hydra: validate, then run_ppo with the V1 (or legacy) task runner; `doctor`
    (Job.doctor) watches the log for progress and fatal lines."""
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
    from grpo_lab.launch.fatal import EngineDied, FatalWatch, TrackedRunner

    log = Path(os.environ["GRPO_LAB_LOG"]) if os.environ.get("GRPO_LAB_LOG") else None
    # a fatal engine / actor line in the log: verl would wait for ever; kill its TaskRunner (grpo_lab/launch/fatal.py)
    tracked = TrackedRunner(runner)
    fatal = FatalWatch(log, stop=tracked.kill, doctor=doctor) if log and doctor else None
    watchers = [doctor.ProgressWatchdog(log), fatal] if fatal else []  # started in this order, stopped in reverse
    try:
        for watcher in watchers:
            watcher.start()
        run_ppo(config, task_runner_class=tracked)
    except BaseException:
        if fatal and fatal.fired and fatal.fired.message:  # stopped by the watcher: say why, not "killed by ray.kill"
            raise EngineDied(fatal.fired.message) from None
        raise
    finally:
        for watcher in reversed(watchers):
            watcher.stop()
        if ray.is_initialized():
            ray.shutdown()


def _diagnose(log: Path, doctor: Any) -> list[Any]:
    """Print the doctor's diagnosis of a failed job's log; the diagnoses (for status.json)."""
    try:
        if doctor is None:
            return []
        log_path, found = doctor.diagnose_path(log)
        print(doctor.format_diagnoses(found, str(log_path)), file=sys.stderr)
        return found
    except Exception as e:  # a diagnosis must never hide the real error
        print(f"grpo-lab: (no diagnosis: {e})", file=sys.stderr)
        return []


@dataclass
class JobStatus:
    path: Path
    started: float = field(default_factory=time.time)

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


@contextlib.contextmanager
def tee_output(log_path: Path) -> Iterator[None]:
    """Copy everything written to this process's stdout and stderr (Ray's forwarded worker output too) to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    tee = subprocess.Popen(["tee", "-a", str(log_path)], stdin=subprocess.PIPE, stdout=saved_out)
    assert tee.stdin is not None
    for fd in (1, 2):
        os.dup2(tee.stdin.fileno(), fd)
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
        for fd, saved in ((1, saved_out), (2, saved_err)):
            os.dup2(saved, fd)
            os.close(saved)
        tee.stdin.close()
        os.environ.pop("GRPO_LAB_LOG", None)
        try:
            tee.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a leftover child still holds the pipe
            tee.kill()
