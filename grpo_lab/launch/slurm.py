"""SLURM sweeps: the checks and the sbatch preview of hydra/launcher=slurm, made before anything is sent; and, inside a
job of several nodes, the Ray cluster that spans them.

    python run.py -m hydra/launcher=slurm hydra.launcher.partition=gpu experiment=smoke rollout_gpu_mem_util=0.3,0.4,0.5
    python run.py -m hydra/launcher=slurm hardware=ray_cluster experiment=smoke actor_lr=1e-6,3e-6   # 2 nodes each

The checks, the sbatch preview and a job of several nodes: docs/launch.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab import facts
from grpo_lab.errors import GrpoLabError
from grpo_lab.labconf import Lab, Slurm

# overrides that change the resources a job needs: the launcher's resources are fixed for the whole sweep
RESOURCE_KEYS = ("hardware", "nnodes", "trainer.nnodes", "ngpus_per_node", "trainer.n_gpus_per_node")
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


def refusal(params: dict[str, Any], job_overrides: Sequence[Sequence[str]] = (),
            nnodes: int | None = None) -> str | None:
    """Why these jobs cannot be sent as they are (with the fix), or None. nnodes: the sweep's trainer.nnodes."""
    nodes = int(params.get("nodes") or 1)
    tasks = int(params.get("tasks_per_node") or 1)
    if tasks != 1:
        return (f"hydra.launcher.tasks_per_node={tasks}: grpo-lab runs one task per node (on the first node verl's "
                f"driver, on each other node a Ray worker node serving all its GPUs); {tasks} tasks per node would "
                f"start {tasks} of them on each machine. Use hydra.launcher.tasks_per_node=1 (the default)")
    if nnodes is not None and nodes != nnodes:
        return (f"hydra.launcher.nodes={nodes} but trainer.nnodes={nnodes}: the job would ask SLURM for {nodes} "
                f"node(s) while verl waits for {nnodes}. Set the nodes with nnodes={nodes} (the launcher follows it) "
                f"and leave hydra.launcher.nodes alone")
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
    from submitit.slurm.slurm import SlurmExecutor, _convert_mem

    generic = SlurmExecutor._equivalence_dict()  # the plugin's generic parameter names -> submitit's SLURM names
    out = {generic.get(key, key): value for key, value in params.items() if key not in _NOT_SBATCH | {"_target_"}}
    if out.get("mem") is not None:
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
    sweep, below, _ = str(params.get("submitit_folder") or "").partition("/.submitit/")
    if below and Path(sweep).is_dir() and {p.name for p in Path(sweep).iterdir()} <= {"multirun.yaml"}:
        shutil.rmtree(sweep)


def check_before_submit(params: dict[str, Any], job_overrides: Sequence[Sequence[str]],
                        nnodes: int | None = None) -> None:
    """Exit 2 with the reason (and, without sbatch here, the header that would have been sent) or return."""
    why = refusal(params, job_overrides, nnodes)
    if why is None and shutil.which("sbatch"):
        return
    _drop_empty_sweep_dir(params)
    if why:
        _fail(f"{why}\nNothing was submitted.")
    _fail(f"no `sbatch` here: hydra/launcher=slurm submits from a SLURM login node. Nothing was submitted; the "
          f"{len(job_overrides)} job(s) would have been sent with:\n{sbatch_preview(params, len(job_overrides))}")


# ---- inside a SLURM job of several nodes: one Ray cluster across the allocation ------------------------------------

class ClusterError(GrpoLabError):
    """The job's Ray cluster cannot be formed; the message says what is missing and what to change (launch.py prints
    it without a traceback and writes it to the job's status.json)."""


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compact host list, as `scontrol show hostnames` prints it: 'gpu[01-03,07],cpu5' -> gpu01 gpu02 gpu03
    gpu07 cpu5. Zero padding is kept; several bracket groups in one name expand as a product (rack[1-2]-n[1-2]).
    submitit's own reader (what its JobEnvironment.hostnames gives), after the checks that say what is wrong."""
    from submitit.slurm.slurm import _parse_node_list

    text = nodelist.strip()
    if not re.fullmatch(r"[^\[\]]*(\[[^\[\]]*\][^\[\]]*)*", text):  # each '[' closed before the next
        raise ClusterError(f"SLURM_JOB_NODELIST={text!r} has an unclosed '[': not a SLURM host list")
    for ranges in re.findall(r"\[([^\]]*)\]", text):
        if not re.fullmatch(r"(\d+(-\d+)?(,\d+(-\d+)?)*)?", ranges):
            raise ClusterError(f"SLURM_JOB_NODELIST={nodelist!r}: cannot read the range [{ranges}]")
    return [h for h in _parse_node_list(text) if h]


@dataclass(frozen=True)
class Allocation:
    """This task's place in a SLURM job of several nodes (from the SLURM_* variables srun sets)."""

    job_id: str
    rank: int  # SLURM_PROCID
    ntasks: int  # SLURM_NTASKS
    hosts: tuple[str, ...]  # SLURM_JOB_NODELIST, expanded
    node: str  # SLURMD_NODENAME: this task's node ("" when SLURM does not say)

    @property
    def head(self) -> str:
        return self.hosts[0]

    @property
    def is_head(self) -> bool:
        # the task on the first node of the list (its name is the address the others join); by rank without a name
        return _short(self.node) == _short(self.head) if self.node else self.rank == 0


def allocation(environ: Mapping[str, str]) -> Allocation | None:
    """This task's allocation when it is one task of a submitit job (hydra/launcher=slurm) on more than one node; None
    otherwise (no SLURM, one node, a salloc shell or a batch script of your own: nothing is started for you there)."""
    if environ.get("SUBMITIT_EXECUTOR") != "slurm" or "SLURM_PROCID" not in environ:
        return None
    nnodes = int(environ.get("SLURM_NNODES") or environ.get("SLURM_JOB_NUM_NODES") or 1)
    if nnodes <= 1:
        return None
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    hosts = expand_nodelist(nodelist)
    if len(hosts) != nnodes:
        raise ClusterError(f"SLURM_JOB_NODELIST={nodelist!r} names {len(hosts)} host(s) but SLURM_NNODES={nnodes}")
    # the job as submitit names its folder: <array job>_<index> for a sweep's array task, else the job id
    array = (environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID"))
    job_id = "_".join(array) if all(array) else environ.get("SLURM_JOB_ID", "?")
    return Allocation(job_id=job_id, rank=int(environ["SLURM_PROCID"]),
                      ntasks=int(environ.get("SLURM_NTASKS") or nnodes), hosts=tuple(hosts),
                      node=environ.get("SLURMD_NODENAME", ""))


def _short(host: str) -> str:
    return host.split(".")[0]


def run_command(cmd: Sequence[str], capture: bool = False) -> tuple[int, str]:
    """Run cmd; (exit code, its stdout+stderr when capture, else '' with the output going to this task's log). A
    captured command (ray start --head, the node query) that has not returned after 5 minutes counts as failed."""
    if capture:
        try:
            p = subprocess.run(list(cmd), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            return 124, out + f"\n(no answer after {e.timeout:g} s)"
        return p.returncode, p.stdout
    return subprocess.run(list(cmd)).returncode, ""


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def ray_executable() -> str:
    """The `ray` of this Python environment (a submitit job's PATH need not have the environment's bin/)."""
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.exists() else "ray"


# the head's view of its cluster: one JSON line of the alive nodes (a separate process: this one's Ray stays unstarted)
_NODES_PY = ("import json, sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
             "print(json.dumps([{'host': n['NodeManagerHostname'], 'ip': n['NodeManagerAddress'], "
             "'gpus': n['Resources'].get('GPU', 0)} for n in ray.nodes() if n['Alive']])); ray.shutdown()")


@dataclass
class RayNodes:
    """The Ray cluster of one SLURM job of several nodes, and what each of its tasks runs. The commands go through
    `run` (tests give a fake one); `reachable`, `sleep` and `clock` are injectable for the same reason."""

    alloc: Allocation
    port: int
    num_cpus: int
    num_gpus: int
    wait_s: float
    run: Callable[..., tuple[int, str]] = run_command
    reachable: Callable[[str, int], bool] = port_open
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    ray: str = "ray"
    poll_s: float = 5.0

    @property
    def address(self) -> str:
        return f"{self.alloc.head}:{self.port}"

    @property
    def described(self) -> dict[str, Any]:
        """lab.ray_cluster: what the preflight reads of the cluster (each node's CPUs)."""
        return {"address": self.address, "hosts": list(self.alloc.hosts), "num_cpus_per_node": self.num_cpus,
                "num_gpus_per_node": self.num_gpus, "source": f"SLURM job {self.alloc.job_id}"}

    def head_command(self) -> list[str]:
        return [self.ray, "start", "--head", f"--port={self.port}", f"--num-cpus={self.num_cpus}",
                f"--num-gpus={self.num_gpus}"]

    def worker_command(self) -> list[str]:
        return [self.ray, "start", f"--address={self.address}", f"--num-cpus={self.num_cpus}",
                f"--num-gpus={self.num_gpus}", "--block"]

    # ---- the head (the first node's task) ----

    def start_head(self) -> None:
        print(f"grpo-lab: Ray head on {self.alloc.head} for the {len(self.alloc.hosts)} nodes of SLURM job "
              f"{self.alloc.job_id}: {' '.join(self.head_command())}", flush=True)
        rc, out = self.run(self.head_command(), capture=True)
        print(out, end="", flush=True)
        if rc != 0:
            tail = "\n".join(out.strip().splitlines()[-8:])
            raise ClusterError(f"`{' '.join(self.head_command())}` failed on {self.alloc.head} (exit {rc}):\n{tail}\n"
                               f"When port {self.port} is taken there (another Ray on that node), pick another: "
                               f"lab.slurm.ray_port={self.port + 1}")

    def alive_nodes(self) -> tuple[list[dict[str, Any]], str]:
        """The cluster's alive nodes (host, ip, gpus), and the query's own output when it failed."""
        rc, out = self.run([sys.executable, "-c", _NODES_PY, self.address], capture=True)
        if rc == 0:
            for line in reversed(out.strip().splitlines()):
                if line.startswith("["):
                    return json.loads(line), ""
        return [], "\n".join(out.strip().splitlines()[-4:])

    def missing(self, nodes: Sequence[Mapping[str, Any]]) -> list[str]:
        seen = {_short(str(n.get("host", ""))) for n in nodes} | {str(n.get("ip", "")) for n in nodes}
        return [h for h in self.alloc.hosts if _short(h) not in seen]

    def wait_for_nodes(self) -> list[dict[str, Any]]:
        """Until all the job's nodes are in the cluster; ClusterError naming the missing ones after wait_s seconds."""
        want = len(self.alloc.hosts)
        deadline = self.clock() + self.wait_s
        shown = -1
        while True:
            nodes, err = self.alive_nodes()
            if len(nodes) >= want:
                gpus = sum(float(n.get("gpus") or 0) for n in nodes)
                print(f"grpo-lab: Ray cluster at {self.address}: {len(nodes)} nodes, {gpus:g} GPUs", flush=True)
                return nodes
            if len(nodes) != shown:
                shown = len(nodes)
                print(f"grpo-lab: Ray cluster at {self.address}: {len(nodes)} of {want} nodes; waiting for "
                      f"{', '.join(self.missing(nodes))} (up to {self.wait_s:g} s)", flush=True)
            if self.clock() >= deadline:
                raise ClusterError(self._timeout_message(nodes, err))
            self.sleep(self.poll_s)

    def _timeout_message(self, nodes: Sequence[Mapping[str, Any]], err: str) -> str:
        missing = self.missing(nodes)
        tasks = ", ".join(f"{h} (task {self.alloc.hosts.index(h)})" for h in missing)
        text = (f"the Ray cluster of SLURM job {self.alloc.job_id} has {len(nodes)} of {len(self.alloc.hosts)} nodes "
                f"after {self.wait_s:g} s; missing: {tasks}. Their `ray start --address={self.address} ...` did "
                f"not join: its output is in that task's log (the sweep's .submitit/{self.alloc.job_id}/ folder, "
                f"*_<task>_log.out/.err). Common causes: the nodes do not reach {self.alloc.head} on port "
                f"{self.port} or Ray's other ports (a firewall between nodes), or another Python environment there. "
                f"Nodes that only start slowly: wait longer with lab.slurm.ray_wait_s={int(self.wait_s * 2)}")
        return text + (f"\nthe last query of the cluster said:\n{err}" if err else "")

    def stop(self) -> None:
        print(f"grpo-lab: stopping Ray on {self.alloc.head}: {self.ray} stop", flush=True)
        self.run([self.ray, "stop"])

    @contextlib.contextmanager
    def running(self) -> Iterator[list[dict[str, Any]]]:
        """The head: start Ray, wait for every node, run the body (verl), and stop Ray however they end (not when
        Ray did not start: what holds the port may be another job's Ray on this node)."""
        self.start_head()
        try:
            yield self.wait_for_nodes()
        finally:
            self.stop()

    # ---- the other nodes' tasks ----

    def serve(self, head_done: Callable[[], bool] = lambda: False) -> str:
        """A worker node: wait for the head's port, then `ray start --address=... --block` until the head's Ray stops.
        Returns what happened (never raises for the head's sake: the head's task reports the job)."""
        me = self.alloc.node or f"task {self.alloc.rank}"
        deadline = self.clock() + self.wait_s
        while not self.reachable(self.alloc.head, self.port):
            if head_done():
                return _say(f"{me}: the job on {self.alloc.head} ended before its Ray started (its status.json and "
                            f"train.log say why); nothing to serve")
            if self.clock() >= deadline:
                return _say(f"{me}: no Ray head at {self.address} after {self.wait_s:g} s; giving up (the head's "
                            f"task log says why; lab.slurm.ray_wait_s waits longer)")
            self.sleep(2.0)
        print(f"grpo-lab: {me} joins the Ray cluster at {self.address}: {' '.join(self.worker_command())}", flush=True)
        rc, _ = self.run(self.worker_command())
        return _say(f"{me}: Ray worker node of {self.address} ended (ray start exit {rc})")


def _say(text: str) -> str:
    print(f"grpo-lab: {text}", flush=True)
    return text


def ray_nodes(trainer: Mapping[str, Any], ray_init: Mapping[str, Any], slurm: Slurm, cpu_cores: int | None,
              alloc: Allocation, **inject: Any) -> RayNodes:
    """The job's RayNodes from what it reads of the config (verl's `trainer` and `ray_kwargs.ray_init`, lab.slurm,
    lab.hardware.cpu_cores): checked against the allocation (the same checks on every task)."""
    nnodes = int(trainer.get("nnodes") or 1)
    if nnodes != len(alloc.hosts):
        raise ClusterError(f"SLURM gave this job {len(alloc.hosts)} nodes ({','.join(alloc.hosts)}) but "
                           f"trainer.nnodes={nnodes}: submit with nnodes={len(alloc.hosts)}, or leave "
                           f"hydra.launcher.nodes alone (it follows nnodes)")
    if alloc.ntasks != nnodes:
        raise ClusterError(f"SLURM started {alloc.ntasks} tasks on {nnodes} nodes: grpo-lab runs one per node (the "
                           f"first node's task is verl's driver, the others Ray worker nodes): "
                           f"hydra.launcher.tasks_per_node=1")
    num_cpus = ray_init.get("num_cpus")
    inject.setdefault("ray", ray_executable())
    return RayNodes(alloc=alloc, port=int(slurm.ray_port), num_cpus=int(cpu_cores if num_cpus is None else num_cpus),
                    num_gpus=int(trainer.get("n_gpus_per_node")), wait_s=float(slurm.ray_wait_s), **inject)


def cluster_for_job(trainer: Mapping[str, Any], ray_kwargs: dict[str, Any], slurm: Slurm, cpu_cores: int | None,
                    environ: Mapping[str, str] = os.environ, **inject: Any) -> RayNodes | None:
    """launch/prepare.py, on every job: None unless this is the head of a SLURM job of several nodes. There: the job
    joins the cluster the head starts (ray_kwargs.ray_init.address=<head>:<port>, no num_cpus), and the RayNodes are
    returned (`described`: lab.ray_cluster, each node's CPUs for the preflight; launch.py runs verl inside
    `.running()`)."""
    alloc = allocation(environ)
    if alloc is None or not alloc.is_head:
        return None
    nodes = ray_nodes(trainer, ray_kwargs.get("ray_init") or {}, slurm, cpu_cores, alloc, **inject)
    init = ray_kwargs.setdefault("ray_init", {})
    init["address"] = nodes.address
    init["num_cpus"] = None  # Ray refuses num_cpus when connecting: each node declared its own with ray start
    return nodes


def serve_ray_worker(cfg: Any, environ: Mapping[str, str] = os.environ, **inject: Any) -> str | None:
    """run.py, on every task: None (run the job) unless this task is one of the other nodes of a SLURM job of several
    nodes. There it serves as a Ray worker node until the head's Ray stops, and returns what happened."""
    alloc = allocation(environ)
    if alloc is None or alloc.is_head:
        return None
    from omegaconf import OmegaConf

    head_done = inject.pop("head_done", None) or _head_status_done()
    verl = {k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("trainer", "ray_kwargs") if k in cfg}
    lab = Lab.of(OmegaConf.to_container(cfg.lab, resolve=True), preflight=OmegaConf.to_container(cfg.preflight))
    me = alloc.node or f"task {alloc.rank}"
    if lab.preflight.only or lab.preflight.fit or lab.preflight.fit_write:
        return _say(f"{me}: planning only (preflight.only / fit): the head plans, no Ray starts here")
    try:
        nodes = ray_nodes(verl.get("trainer") or {}, (verl.get("ray_kwargs") or {}).get("ray_init") or {},
                          lab.slurm, lab.hardware.cpu_cores, alloc, **inject)
    except ClusterError as e:  # the head's task refuses the job with the same message
        return _say(f"{me}: {e}")
    return nodes.serve(head_done=head_done)


def _head_status_done() -> Callable[[], bool]:
    """Whether the head's job has ended (its status.json, in the job folder every task of the job shares)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        status = Path(HydraConfig.get().runtime.output_dir) / "status.json"
    except Exception:  # not inside a Hydra job: no early end
        return lambda: False

    def done() -> bool:
        return facts.load_json_or(status, {}).get("status") in ("ok", "failed")

    return done
