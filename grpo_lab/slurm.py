"""SLURM sweeps: the checks and the sbatch preview of hydra/launcher=slurm, made before anything is sent.

    python run.py -m hydra/launcher=slurm hydra.launcher.partition=gpu experiment=smoke rollout_gpu_mem_util=0.3,0.4,0.5

conf/hydra/launcher/slurm.yaml sizes each job from the hardware option (nodes, GPUs per node, CPUs, memory). Its
launcher, hydra_plugins/grpo_lab_slurm (Hydra takes launcher classes only from the hydra_plugins package), is
hydra-submitit-launcher's SlurmLauncher plus these checks, in the submitting process and before any sbatch:

* one node per job: grpo-lab does not start Ray across the nodes of a SLURM allocation, and without one Ray cluster
  spanning them each node's task would run its own driver. trainer.nnodes > 1 is refused with what to do instead.
* the resources are set once per sweep (Hydra builds the launcher from the sweep's base config), so a sweep over
  nnodes, ngpus_per_node or hardware is refused: run one sweep per hardware option.
* no `sbatch` on this machine (not a SLURM login node): refused, with the sbatch header that would have been sent.

`sbatch_preview(n_jobs)` renders that header with submitit's own sbatch writer (submitit.slurm.slurm's
_make_sbatch_string), from the parameters exactly as the plugin's launch() hands them to submitit.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# overrides that change the resources a job needs: the launcher's resources are fixed for the whole sweep
RESOURCE_KEYS = ("hardware", "nnodes", "trainer.nnodes", "ngpus_per_node", "trainer.n_gpus_per_node")
# the plugin's generic parameter names -> submitit's SLURM names (submitit's SlurmExecutor._equivalence_dict)
_GENERIC = {"name": "job_name", "timeout_min": "time", "mem_gb": "mem", "nodes": "nodes",
            "cpus_per_task": "cpus_per_task", "gpus_per_node": "gpus_per_node", "tasks_per_node": "ntasks_per_node",
            "stderr_to_stdout": "stderr_to_stdout"}
# the plugin's parameters that configure the executor, not the sbatch file
_NOT_SBATCH = {"submitit_folder", "max_num_timeout"}


def _fail(message: str) -> None:
    print(f"grpo-lab: {message}", file=sys.stderr)
    raise SystemExit(2)


def _override_values(job_overrides: Sequence[Sequence[str]], key: str) -> set[str]:
    values = set()
    for overrides in job_overrides:
        for o in overrides:
            k, sep, v = o.lstrip("+~").partition("=")
            if sep and k == key:
                values.add(v)
    return values


def refusal(params: dict[str, Any], job_overrides: Sequence[Sequence[str]] = ()) -> str | None:
    """Why these jobs cannot be sent as they are (with the fix), or None."""
    nodes = int(params.get("nodes") or 1)
    if nodes > 1:
        return (f"hydra/launcher=slurm with trainer.nnodes={nodes}: grpo-lab runs one node per SLURM job. verl needs "
                f"one Ray cluster spanning all {nodes} nodes, and grpo-lab does not start Ray across the nodes of an "
                f"allocation (each node's task would run its own driver). Use nnodes=1 here (one job per sweep point "
                f"on one node), or for {nodes} nodes start Ray yourself inside an allocation and join it: "
                f"README, 'More than one machine' (python run.py hardware=ray_cluster nnodes={nodes})")
    for key in RESOURCE_KEYS:
        values = _override_values(job_overrides, key)
        if len(values) > 1:
            return (f"this sweep changes {key} ({', '.join(sorted(values))}), but the SLURM launcher sizes every job "
                    f"of a sweep alike (nodes {params.get('nodes')}, {params.get('gpus_per_node')} GPUs, "
                    f"{params.get('cpus_per_task')} CPUs, {params.get('mem_gb')} GB): run one sweep per value, "
                    f"e.g. python run.py -m hydra/launcher=slurm {key}={sorted(values)[0]} ...")
    return None


def sbatch_parameters(params: dict[str, Any], n_jobs: int = 1) -> dict[str, Any]:
    """The keyword arguments submitit's sbatch writer gets for these launcher parameters (as launch() passes them)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key in _NOT_SBATCH or key == "_target_":
            continue
        out[_GENERIC.get(key, key)] = value
    if out.get("mem") is not None:
        from submitit.slurm.slurm import _convert_mem

        out["mem"] = _convert_mem(out["mem"])
    out["map_count"] = n_jobs  # map_array: one array task per sweep point
    return {k: v for k, v in out.items() if v is not None}


def sbatch_preview(params: dict[str, Any], n_jobs: int = 1) -> str:
    """The #SBATCH header submitit would write for these parameters (its own writer; nothing is submitted)."""
    from submitit.slurm.slurm import _make_sbatch_string

    text = _make_sbatch_string(command="<submitit runs the sweep job here>", folder=params["submitit_folder"],
                               **sbatch_parameters(params, n_jobs))
    return "\n".join(line for line in text.splitlines() if line.startswith("#SBATCH"))



def _drop_empty_sweep_dir(params: dict[str, Any]) -> None:
    """Hydra makes the sweep folder (with its multirun.yaml) before the launcher runs: a refused sweep leaves none."""
    folder = str(params.get("submitit_folder") or "")
    sweep = Path(folder.split("/.submitit/")[0]) if "/.submitit/" in folder else None
    if sweep is not None and sweep.is_dir() and {p.name for p in sweep.iterdir()} <= {"multirun.yaml"}:
        shutil.rmtree(sweep)


def check_before_submit(params: dict[str, Any], job_overrides: Sequence[Sequence[str]]) -> None:
    """Exit 2 with the reason (and, without sbatch here, the header that would have been sent) or return."""
    why = refusal(params, job_overrides) or (None if shutil.which("sbatch") else "")
    if why is not None:
        _drop_empty_sweep_dir(params)
    if why:
        _fail(f"{why}\nNothing was submitted.")
    if shutil.which("sbatch") is None:
        _fail(f"no `sbatch` here: hydra/launcher=slurm submits from a SLURM login node. Nothing was submitted; the "
              f"{len(job_overrides)} job(s) would have been sent with:\n{sbatch_preview(params, len(job_overrides))}")
