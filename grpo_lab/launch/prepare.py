"""The launch's prepare stage, every change to the config in one place: `split` (resolved in the driver, grpo-lab's
sections as one typed view), `prepare` (checkpoint folder, jobs side by side, the micro-batch `settle`d, the SLURM
job's cluster, the workers' environment and a smaller card `emulate`d, then the job's one `Run` and vLLM's KV cache
pinned from its plan). The rules (grpo_lab/checks/) read what they did from the Run (lab.micro_batch,
lab.side_by_side_kv_pin, ...).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from grpo_lab import facts
from grpo_lab.checks.microbatch import sizes_given, switches
from grpo_lab.cli.knobs import SHORT_KEYS, followers, knob_keys
from grpo_lab.errors import GrpoLabError
from grpo_lab.labconf import Lab
from grpo_lab.memory.emulate import ALLOC_VARS, ENV_VARS
from grpo_lab.memory.run import Run, planned_kv_bytes
from grpo_lab.memory.settings import kv_cache_memory_bytes
from grpo_lab.memory.verl_view import KV_PIN, VerlView
from grpo_lab.verl_keys import MISSING, flatten, lookup, put, with_value

if TYPE_CHECKING:
    from grpo_lab.cli.overrides import CommandLine
    from grpo_lab.cli.provenance import Layers
    from grpo_lab.launch.slurm import RayNodes
    from grpo_lab.memory.emulate import Emulated

OUR_KEYS = frozenset({"lab", "preflight"}) | SHORT_KEYS


def split(cfg: DictConfig) -> tuple[dict[str, Any], Lab]:
    """(verl config as a plain resolved dict, the job's typed view of grpo-lab's own sections)."""
    # section by section: a `hydra` node (composed with return_hydra_config, as the tests do) is never verl's
    resolved = {k: _plain(cfg[k]) for k in cfg if k != "hydra"}
    # verl keys set on their own, which their short key no longer reaches: fixes name them (grpo_lab/checks/fixes.py)
    lab = Lab.of(resolved.get("lab"), preflight=resolved.get("preflight") or {}, set_apart=set_apart(cfg))
    return {k: v for k, v in resolved.items() if k not in OUR_KEYS}, lab


def set_apart(cfg: Any) -> dict[str, list[str]]:
    """{short key, or a verl key others read: the keys that read it (conf/config.yaml's, verl's) and that this composed
    (unresolved) config sets on their own}: it no longer reaches them, so a fix must name them (docs/cli.md)."""
    def own(k: str) -> bool:
        parent, _, leaf = k.rpartition(".")
        node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
        if not isinstance(node, DictConfig):
            return False
        try:  # an interpolation first: `leaf in node` would resolve it (OmegaConf parses it anew each time)
            return not OmegaConf.is_interpolation(node, leaf) and leaf in node
        except (KeyError, AttributeError):  # not there, in a struct config
            return False

    # verl's too: the log-prob passes' budgets read the update's, and speed=fast sets all three
    leaders = [(key, knob_keys(key)) for key in sorted(SHORT_KEYS)]
    leaders += [(key, keys) for key, keys in followers().items() if key not in SHORT_KEYS]
    return {key: own_keys for key, keys in leaders if (own_keys := [k for k in keys if own(k)])}


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True, throw_on_missing=False) if OmegaConf.is_config(value) else value


def checkpoint_key(override_dirname: str) -> str:
    """A folder name for one sweep job's checkpoints, made from its overrides (same overrides, same folder)."""
    key = re.sub(r"[^\w.=,+-]", "_", override_dirname) or "defaults"
    if len(key) > 100:
        key = key[:80] + "-" + hashlib.sha1(override_dirname.encode()).hexdigest()[:12]
    return key


@dataclass(frozen=True)
class Job:
    """One Hydra job, as the stages see it."""

    dir: Path  # its output folder
    multirun: bool  # a sweep point
    override_dirname: str  # its overrides as one name (a sweep point's checkpoint folder)
    cli: CommandLine | None = None  # the command line run.py parsed; None: composed without it (a test)
    # what reads a failed job's log (run.py hands grpo_lab.after_run.doctor: diagnose_path, format_diagnoses,
    # errors_in, ProgressWatchdog); None: no diagnosis, no watchdog
    doctor: Any = None

    @classmethod
    def current(cls, cli: CommandLine | None = None, doctor: Any = None) -> Job:
        hc = HydraConfig.get()
        return cls(Path(hc.runtime.output_dir), hc.mode == RunMode.MULTIRUN, hc.job.override_dirname, cli, doctor)


@dataclass(frozen=True)
class Prepared:
    """prepare's output: the job's Run (as planned) and the config verl gets."""

    run: Run  # the job as planned: its settings, model, memory and time plans (grpo_lab/memory/run.py)
    verl: dict[str, Any]  # what verl gets: emulation's scaled utilizations, side by side's KV pin
    emulation: dict[str, Any] | None = None  # plan.json's "emulation" (grpo_lab/memory/emulate.py); None without
    cluster: RayNodes | None = None  # the Ray cluster of a SLURM job of several nodes (its first node only)
    multirun: bool = False  # a sweep point (its checkpoint folder is its own)

    @cached_property
    def changed(self) -> list[dict[str, Any]]:
        """plan.json's changed_defaults: what verl gets that is not verl's default, and what set it (the launcher's
        KV pin, emulation's scaling); worked out when first read (the check stage: make fit's jobs write no plan)."""
        changed = changed_defaults(self.verl, self.run.layers, self.multirun)
        pin = self.run.lab.side_by_side_kv_pin  # side by side's KV cache pin: {"bytes", "by"}
        if pin and pin["by"] == "launcher":  # the launcher's pin says what set it
            for item in changed:
                if item["key"] == KEY:
                    item["set_by"] = SET_BY
        if self.emulation:
            mark_scaled(changed, self.emulation)
        return changed


def prepare(cfg: DictConfig, job: Job) -> Prepared:
    """The job's Run, from the composed config with what this job adds: a sweep point's own checkpoint folder, how
    many jobs run side by side, the micro-batch settled, the SLURM job's Ray cluster, the workers' environment and
    an emulated card; and the config verl gets. Input that cannot be planned is refused here, before anything is
    written."""
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
        ckpt = os.path.join(VerlView.of(verl).trainer.default_local_dir, checkpoint_key(job.override_dirname))
        put(verl, "trainer.default_local_dir", ckpt)
        # hydra/launcher=side_by_side: min(n_jobs, the sweep's jobs) share the GPUs and host (rule side_by_side_jobs)
        points = job.cli.sweep_points() if job.cli is not None else None
        lab.side_by_side_jobs = min(side_by_side_jobs(HydraConfig.get().launcher), points or sys.maxsize)
    layers = job_layers(job.cli.env_names if job.cli is not None else None)
    # the user's micro-batch size wins over our dynamic batching default (`settle` below; rule
    # micro_batch_explicit reports it)
    lab.micro_batch = settle(verl, layers)
    # the first node of a SLURM job of several nodes starts a Ray cluster across them (train runs verl inside it) and
    # the job joins it by address (grpo_lab/launch/slurm.py); None everywhere else
    cluster = cluster_for_job(verl.get("trainer") or {}, verl.setdefault("ray_kwargs", {}), lab.slurm,
                              lab.hardware.cpu_cores)
    if cluster:
        lab.ray_cluster = cluster.described  # each node's CPUs, for the preflight
    emulated = emulate(verl, lab, job)
    run = Run.build(emulated.planned, lab, os.environ, layers=layers)
    engine_verl, pin = pin_side_by_side(run, emulated.verl)
    if pin:  # the rule side_by_side_jobs reads it; the plans are the same (the pin is in verl's copy only)
        run = replace(run, lab=replace(lab, side_by_side_kv_pin=pin))
    return Prepared(run, engine_verl, emulated.info, cluster, job.multirun)


def emulate(verl: dict[str, Any], lab: Lab, job: Job) -> Emulated:
    """The config as the preflight plans it and as verl gets it: the workers' environment added, then the one
    transform for an emulated smaller card (grpo_lab/memory/emulate.py; without emulation both are the same dict)."""
    from grpo_lab.memory.emulate import EmulationError
    from grpo_lab.memory.emulate import emulate as for_card

    config = with_value(verl, facts.RAY_ENV_VARS, worker_env(VerlView.of(verl), lab, job.dir))
    try:
        return for_card(config, lab, os.environ)
    except EmulationError as e:
        raise GrpoLabError(str(e)) from None


def side_by_side_jobs(launcher: Any) -> int:
    """How many jobs of this sweep may run at once: Hydra's joblib launcher's n_jobs
    (conf/hydra/launcher/side_by_side.yaml; joblib's -1 = one a CPU core), 1 for a launcher that runs one job after
    another or each on its own machines."""
    from grpo_lab.cli.apply import jobs_at_once

    try:
        if "JoblibLauncher" not in str(launcher.get("_target_", "")):
            return 1
        return jobs_at_once(launcher.get("n_jobs") or 1)
    except (AttributeError, TypeError, ValueError):
        return 1


def worker_env(cfg: VerlView, lab: Lab, job_dir: Path) -> dict[str, Any]:
    """The environment of verl's Ray workers (Ray wants string values): the job's own, with ours added where the
    user set nothing."""
    env = dict(cfg.env_vars)
    ours = {"VERL_FILE_LOGGER_PATH": str(job_dir.resolve() / "metrics.jsonl")}
    if "wandb" in (cfg.trainer.logger or ()):
        ours["WANDB_DIR"] = str(job_dir.resolve())
        ours["WANDB_MODE"] = os.environ.get("WANDB_MODE") or str(lab.wandb.mode or "offline")
    if importlib.util.find_spec("flashinfer") is None and "VLLM_USE_FLASHINFER_SAMPLER" not in os.environ:
        # vLLM's sampler imports flashinfer unless told not to: "No module named 'flashinfer'" at engine start
        ours["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    return env | {k: v for k, v in ours.items() if k not in env}


def mark_scaled(changed: list[dict[str, Any]], info: Mapping[str, Any]) -> None:
    """plan.json's changed_defaults (what verl got) says which values emulation (grpo_lab/memory/emulate.py) scaled,
    from what."""
    for item in changed:
        if item.get("key") in {f"{ENV_VARS}.{v}" for v in ALLOC_VARS}:
            item["set_by"] = ("emulation (grpo_lab/memory/emulate.py): the torch cap, merged into your own setting "
                              "if any")
        u = info["gpu_memory_utilization"].get(item.get("key"))
        if u is not None:
            item["set_by"] = (f"{item.get('set_by') or 'verl'}; emulation (grpo_lab/memory/emulate.py) scaled "
                              f"{u['planned']:g} of a {info['card_gb']:g} GB card to {u['handed_to_engine']:g} of "
                              f"{info['real_gpu_memory_gb']:g} GB")


# ---- the user's micro-batch (grpo_lab/checks/microbatch.py: the passes, and what the rule reports) ----

DEFAULTS_FILE = "conf/config.yaml"  # grpo-lab's own defaults; every other layer is the user's choice


def _users(set_by: str | None) -> bool:
    """Whether a layer of the user's set it: the command line, the environment, a conf/ file other than the
    defaults (an experiment file of theirs); not conf/config.yaml, not verl."""
    return bool(set_by) and not set_by.startswith((DEFAULTS_FILE, "verl", "grpo_lab/"))


def _set_by(layers: Layers, key: str) -> str | None:
    found = layers.set_by(key)
    return found[1] if found else None


def settle(verl: dict[str, Any], layers: Layers) -> dict[str, Any]:
    """Turn grpo-lab's dynamic batching default off where the user's micro-batch would be ignored (in place).

    Returns what the rule micro_batch_explicit reports: {"micro": [{pass, key, value, set_by}], "turned_off": [{key,
    set_by}], "kept_on": [{key, set_by}]} ({} when the user gave no micro-batch size)."""
    cfg = VerlView.of(verl)
    micro = [{"pass": name, "key": key, "value": value, "set_by": by} for name, key, value in sizes_given(cfg)
             if _users(by := _set_by(layers, key))]
    if not micro:
        return {}
    on_off = [(dyn, on, _set_by(layers, dyn)) for dyn, on in switches(cfg)]
    kept = [{"key": dyn, "set_by": by} for dyn, on, by in on_off if on and _users(by)]
    # no use_dynamic_bsz=true of the user's: their micro-batch wins over our default
    off = [] if kept else [{"key": dyn, "set_by": by} for dyn, on, by in on_off if on]
    for item in off:
        put(verl, item["key"], False)
    return {"micro": micro, "turned_off": off, "kept_on": kept}



# ---- side by side: vLLM's KV cache pinned to the plan's ----

KEY = KV_PIN
SET_BY = "hydra/launcher=side_by_side: the memory plan's KV cache (grpo_lab/launch/prepare.py)"


def pin_side_by_side(run: Run, verl: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Under side by side (lab.side_by_side_jobs > 1): (the config verl gets, the pin). The user's own pin is
    kept; else the plan's KV cache goes into verl's config only (a copy): the preflight plans the config as the user
    wrote it, so a fix that changes vLLM's share is re-checked with the cache it sizes."""
    if run.lab.side_by_side_jobs <= 1:
        return verl, None
    own = kv_cache_memory_bytes(run.cfg)
    if own is not None:
        return verl, {"bytes": own, "by": "user"}
    n = planned_kv_bytes(run.memory)
    if n is None:
        return verl, None
    verl = copy.deepcopy(verl)
    put(verl, KEY, n)
    return verl, {"bytes": n, "by": "launcher"}


def changed_defaults(verl: Mapping[str, Any], layers: Layers, multirun: bool = False) -> list[dict[str, Any]]:
    """plan.json's changed_defaults: every leaf of `verl` that differs from verl's default (or that verl does not
    have), and every default leaf that `verl` no longer has; each with what set it (grpo_lab/cli/provenance.py)."""
    from grpo_lab.cli.provenance import verl_defaults

    defaults = verl_defaults()
    out = []
    paths = set()  # every key of verl: its leaves and the sections above them
    for key, ours in flatten(verl):
        paths.update(key.rsplit(".", n)[0] for n in range(key.count(".") + 1))
        if key.endswith("_target_"):
            continue
        theirs = lookup(defaults, key)
        if theirs is not MISSING and _same(theirs, ours):
            continue
        out.append({"key": key, "verl": "(not in verl's config)" if theirs is MISSING else theirs, "ours": ours,
                    "set_by": layers.source(key)})
    for key, theirs in flatten(defaults):
        if key not in paths and not key.endswith("_target_"):
            out.append({"key": key, "verl": theirs, "ours": "(removed)", "set_by": layers.source(key)})
    if multirun:
        for item in out:
            if item["key"] == "trainer.default_local_dir":
                item["set_by"] += "; grpo_lab/launch/job.py adds the sweep job's folder"
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b and type(a) is type(b)
    return a == b
