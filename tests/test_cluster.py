"""More than one machine: hardware=ray_cluster joins a running Ray cluster; hydra/launcher=slurm sizes one SLURM job
per sweep point from the hardware option, and inside a job of several nodes starts one Ray cluster across them.
Nothing is submitted and no Ray starts here (no SLURM on the test machine): the SLURM_* variables are faked and the
commands go to a recording runner."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import compose_cfg, compose_split, composed, planned, run_py
from hydra.utils import instantiate
from omegaconf import OmegaConf

from grpo_lab.errors import GrpoLabError
from grpo_lab.facts import load_yaml
from grpo_lab.launch import slurm
from grpo_lab.verl_keys import get

# ---- hardware=ray_cluster ------------------------------------------------------------------------------------------

def test_ray_cluster_joins_by_address_without_num_cpus(tmp_path):
    p = run_py("hardware=ray_cluster", "nnodes=3", "--cfg", "job", "--resolve", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    cfg = yaml.safe_load(p.stdout)
    assert get(cfg, "ray_kwargs.ray_init.address") == "auto"
    assert cfg["ray_kwargs"]["ray_init"]["num_cpus"] is None  # Ray refuses num_cpus when connecting
    assert cfg["trainer"]["nnodes"] == 3 and cfg["trainer"]["n_gpus_per_node"] == 4
    # the course machine's facts per node, and its NCCL setting on every node
    assert get(cfg, "ray_kwargs.ray_init.runtime_env.env_vars.NCCL_P2P_DISABLE") == "1"
    p = run_py("hardware=ray_cluster", "ray_kwargs.ray_init.address=10.0.0.1:6379", "--cfg", "job", "--resolve",
               cwd=tmp_path)
    assert get(yaml.safe_load(p.stdout), "ray_kwargs.ray_init.address") == "10.0.0.1:6379"


def test_verl_validates_the_cluster_config():
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    verl, lab = compose_split("hardware=ray_cluster")
    assert lab.hardware.gpu_memory_gb == 32 and lab.hardware.cpu_cores == 16  # per node
    cfg = OmegaConf.create(verl)
    OmegaConf.set_struct(cfg, True)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node == 8


def test_one_node_cluster_plans_through_run_py(tmp_path):
    # joining a one-node cluster: the preflight counts the node's 16 cores (3 x 4 GPUs + 4 = 16)
    p = run_py("hardware=ray_cluster", "nnodes=1", "preflight.only=true", cwd=tmp_path)
    assert planned(p), p.stdout + p.stderr
    assert "on ray_cluster" in p.stdout


# ---- hydra/launcher=slurm ------------------------------------------------------------------------------------------

def _launcher(*overrides):
    cfg = compose_cfg("hydra/launcher=slurm", *overrides)
    return instantiate(cfg.hydra.launcher)


@pytest.mark.parametrize("hardware,gpus,cpus,mem", [("rtx4080x4", 4, 16, 128), ("h200x1", 1, 16, 128),
                                                     ("a100_80gbx8", 8, 64, 1024)])
def test_slurm_job_is_sized_by_the_hardware_option(hardware, gpus, cpus, mem):
    launcher = _launcher(f"hardware={hardware}", "experiment=smoke")
    assert type(launcher).__name__ == "GrpoLabSlurmLauncher"
    p = launcher.params
    assert (p["nodes"], p["gpus_per_node"], p["tasks_per_node"], p["cpus_per_task"], p["mem_gb"]) == (
        1, gpus, 1, cpus, mem)
    assert p["timeout_min"] == 240 and p["partition"] is None and p["name"] == "smoke_qwen3_0_6b"
    # what submitit's own sbatch writer makes of them, for a sweep of 3 points: one array task each
    header = launcher.sbatch_preview(3).splitlines()
    for line in (f"#SBATCH --gpus-per-node={gpus}", f"#SBATCH --cpus-per-task={cpus}", f"#SBATCH --mem={mem}GB",
                 "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1", "#SBATCH --time=240", "#SBATCH --array=0-2%3",
                 "#SBATCH --job-name=smoke_qwen3_0_6b"):
        assert line in header, (line, header)
    assert not any("--partition" in h for h in header)


def test_slurm_partition_time_and_memory_are_overridable():
    launcher = _launcher("hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=1440", "hydra.launcher.mem_gb=120")
    header = launcher.sbatch_preview()
    assert "#SBATCH --partition=gpu" in header and "#SBATCH --time=1440" in header and "#SBATCH --mem=120GB" in header
    # Ray's CPUs (the hardware option's num_cpus) fit in what the job asks for
    verl, _ = compose_split("hydra/launcher=slurm")
    assert get(verl, "ray_kwargs.ray_init.num_cpus") <= launcher.params["cpus_per_task"]


def test_run_py_sweep_without_sbatch_shows_what_would_be_sent(tmp_path):
    p = run_py("-m", "hydra/launcher=slurm", "experiment=smoke", "hydra.launcher.partition=gpu",
               "rollout_gpu_mem_util=0.3,0.4,0.5", cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 2, p.stdout + p.stderr
    assert "no `sbatch` here" in p.stderr
    assert "Nothing was submitted; the 3 job(s) would have been sent with" in p.stderr
    for line in ("#SBATCH --array=0-2%3", "#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=16",
                 "#SBATCH --mem=128GB", "#SBATCH --partition=gpu", "#SBATCH --nodes=1"):
        assert line in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "outputs" / "sweeps").exists() or not any((tmp_path / "outputs" / "sweeps").iterdir())


def test_two_node_jobs_are_sized_per_node():
    # hardware=ray_cluster: nnodes=2 course machines; the job asks for 2 nodes, one task each, each node's resources
    launcher = _launcher("hardware=ray_cluster", "experiment=smoke")
    p = launcher.params
    assert (p["nodes"], p["tasks_per_node"], p["gpus_per_node"], p["cpus_per_task"], p["mem_gb"]) == (2, 1, 4, 16, 128)
    header = launcher.sbatch_preview(2).splitlines()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --cpus-per-task=16", "#SBATCH --mem=128GB", "#SBATCH --array=0-1%2"):
        assert line in header, (line, header)
    assert slurm.refusal(p, [["actor_lr=1e-6"], ["actor_lr=3e-6"]], nnodes=2) is None
    # any hardware option with nnodes=2 the same way
    p = _launcher("hardware=a100_80gbx8", "nnodes=2").params
    assert (p["nodes"], p["tasks_per_node"], p["gpus_per_node"], p["cpus_per_task"], p["mem_gb"]) == (2, 1, 8, 64, 1024)


def test_run_py_two_node_sweep_shows_what_would_be_sent(tmp_path):
    p = run_py("-m", "hydra/launcher=slurm", "hardware=ray_cluster", "experiment=smoke", "actor_lr=1e-6,3e-6",
               cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 2, p.stdout + p.stderr
    assert "no `sbatch` here" in p.stderr and "the 2 job(s) would have been sent with" in p.stderr
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --cpus-per-task=16", "#SBATCH --mem=128GB"):
        assert line in p.stderr
    assert "one node per SLURM job" not in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("override,says", [
    ("hydra.launcher.tasks_per_node=2", "hydra.launcher.tasks_per_node=2: grpo-lab runs one task per node"),
    ("hydra.launcher.nodes=3", "hydra.launcher.nodes=3 but trainer.nnodes=2"),
])
def test_run_py_refuses_what_a_job_of_several_nodes_cannot_run(override, says, tmp_path):
    p = run_py("-m", "hydra/launcher=slurm", "hardware=ray_cluster", override, cwd=tmp_path)
    assert p.returncode == 2
    assert says in p.stderr and "Nothing was submitted" in p.stderr and "Traceback" not in p.stderr


def test_a_sweep_over_hardware_is_refused():
    params = {"nodes": 1, "gpus_per_node": 4, "cpus_per_task": 16, "mem_gb": 128}
    why = slurm.refusal(params, [["hardware=rtx4080x4", "x=1"], ["hardware=h200x1", "x=1"]])
    assert "this sweep changes hardware (h200x1, rtx4080x4)" in why and "one sweep per value" in why
    assert slurm.refusal(params, [["hardware=h200x1", "x=1"], ["hardware=h200x1", "x=2"]]) is None


# ---- inside a SLURM job of several nodes: one Ray cluster across the allocation ------------------------------------

@pytest.mark.parametrize("nodelist,hosts", [
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("gpu5", ["gpu5"]),
    ("a[8-10],b[098-100]", ["a8", "a9", "a10", "b098", "b099", "b100"]),
    ("rack[1-2]-n[1-2],login", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2", "login"]),
    ("n1,n2", ["n1", "n2"]),
])
def test_nodelist_expands_like_scontrol_show_hostnames(nodelist, hosts):
    assert slurm.expand_nodelist(nodelist) == hosts


def test_a_nodelist_that_is_not_one_is_refused():
    with pytest.raises(slurm.ClusterError, match="unclosed"):
        slurm.expand_nodelist("node[01-03")
    with pytest.raises(slurm.ClusterError, match="cannot read the range"):
        slurm.expand_nodelist("node[a-c]")


def _env(node="gpu07", rank=0, nodelist="gpu[07-08]", nnodes=2, ntasks=2):
    env = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_PROCID": str(rank),
           "SLURM_NNODES": str(nnodes), "SLURM_NTASKS": str(ntasks), "SLURM_JOB_NODELIST": nodelist}
    if node:
        env["SLURMD_NODENAME"] = node
    return env


def test_the_role_comes_from_the_first_host_of_the_nodelist():
    head = slurm.allocation(_env())
    assert head.is_head and head.hosts == ("gpu07", "gpu08") and head.head == "gpu07"
    assert not slurm.allocation(_env(node="gpu08", rank=1)).is_head
    # the first host decides, whatever the rank; without a node name, rank 0 is the head
    assert slurm.allocation(_env(node="gpu07.cluster.local", rank=1)).is_head
    assert slurm.allocation(_env(node="", rank=0)).is_head and not slurm.allocation(_env(node="", rank=1)).is_head
    # nothing to start: no SLURM, one node, or a SLURM shell or script of the user's own (not started by submitit)
    assert slurm.allocation({}) is None
    assert slurm.allocation(_env(nodelist="gpu07", nnodes=1, ntasks=1)) is None
    assert slurm.allocation({k: v for k, v in _env().items() if k != "SUBMITIT_EXECUTOR"}) is None
    with pytest.raises(slurm.ClusterError, match="names 2 host"):
        slurm.allocation(_env(nnodes=3))


class FakeRay:
    """A recording command runner and a fake cluster: `ray start` succeeds; the node query answers with `alive`."""

    def __init__(self, alive=("gpu07", "gpu08"), head_rc=0):
        self.calls: list[list[str]] = []
        self.alive = list(alive)
        self.head_rc = head_rc
        self.now = 0.0

    def __call__(self, cmd, capture=False):
        self.calls.append(list(cmd))
        if cmd[1:3] == ["-c", slurm._NODES_PY]:
            nodes = [{"host": f"{h}.cluster", "ip": f"10.0.0.{i}", "gpus": 4.0} for i, h in enumerate(self.alive)]
            return 0, "ray log line\n" + json.dumps(nodes) + "\n"
        if cmd[1:3] == ["start", "--head"]:
            return self.head_rc, "Ray runtime started.\n" if not self.head_rc else "ConnectionError: port 6379 taken\n"
        return 0, ""

    def sleep(self, s):
        self.now += s

    def clock(self):
        return self.now

    def ray_calls(self):
        return [c[1:] for c in self.calls if c[0] == "ray"]


def _cluster(verl, lab, env, **inject):
    """What launch/prepare.py does with the head's cluster: verl joins it, lab.ray_cluster describes it."""
    nodes = slurm.cluster_for_job(verl["trainer"], verl["ray_kwargs"], lab.slurm, lab.hardware.cpu_cores, env,
                                  **inject)
    lab.ray_cluster = nodes.described
    return nodes


def _head(fake, *overrides, env=None):
    verl, lab = composed("hardware=ray_cluster", *overrides)
    nodes = _cluster(verl, lab, env or _env(), run=fake, sleep=fake.sleep, clock=fake.clock, ray="ray")
    return verl, lab, nodes


def test_the_head_starts_ray_waits_for_every_node_runs_the_job_joined_and_stops_ray():
    fake = FakeRay(alive=("gpu07",))
    verl, lab, nodes = _head(fake)
    # the job joins <first node>:<port> and passes no num_cpus; the preflight learns each node's CPUs
    assert get(verl, "ray_kwargs.ray_init.address") == "gpu07:6379"
    assert get(verl, "ray_kwargs.ray_init.num_cpus") is None
    assert lab.ray_cluster["num_cpus_per_node"] == 16 and lab.ray_cluster["hosts"] == ["gpu07", "gpu08"]
    assert fake.calls == []  # nothing starts before the preflight has passed
    ran = []

    def query(cmd, capture=False):  # gpu08 joins at the third look
        if cmd[1:3] == ["-c", slurm._NODES_PY] and len([c for c in fake.calls if c[0] != "ray"]) == 2:
            fake.alive.append("gpu08")
        return fake(cmd, capture)

    nodes.run = query
    with nodes.running() as alive:
        ran.append(len(alive))
    assert ran == [2]
    assert fake.ray_calls() == [["start", "--head", "--port=6379", "--num-cpus=16", "--num-gpus=4"], ["stop"]]
    queries = [c for c in fake.calls if c[0] != "ray"]
    assert len(queries) == 3 and queries[0][-1] == "gpu07:6379" and fake.now == 10.0


def test_the_head_port_and_cpus_come_from_the_config():
    fake = FakeRay()
    verl, lab, nodes = _head(fake, "lab.slurm.ray_port=7001", "lab.hardware.cpu_cores=24")
    assert get(verl, "ray_kwargs.ray_init.address") == "gpu07:7001"
    assert nodes.head_command() == ["ray", "start", "--head", "--port=7001", "--num-cpus=24", "--num-gpus=4"]
    # a hardware option that sets Ray's num_cpus: each node's ray start gets it, and the job joins without it
    verl, lab = composed("hardware=rtx4080x4", "nnodes=2", "ray_kwargs.ray_init.num_cpus=14")
    nodes = _cluster(verl, lab, _env(), run=fake, ray="ray")
    assert nodes.worker_command() == ["ray", "start", "--address=gpu07:6379", "--num-cpus=14", "--num-gpus=4",
                                      "--block"]
    assert get(verl, "ray_kwargs.ray_init.num_cpus") is None


def test_the_head_times_out_naming_the_nodes_that_never_joined():
    fake = FakeRay(alive=("gpu07",))
    _, _, nodes = _head(fake, "nnodes=3", "lab.slurm.ray_wait_s=60",
                        env=_env(nodelist="gpu[07-09]", nnodes=3, ntasks=3))
    with pytest.raises(slurm.ClusterError) as e:
        with nodes.running():
            pytest.fail("the job must not run without every node")
    msg = str(e.value)
    assert "has 1 of 3 nodes after 60 s; missing: gpu08 (task 1), gpu09 (task 2)" in msg
    assert "ray start --address=gpu07:6379" in msg and "lab.slurm.ray_wait_s=120" in msg
    assert fake.ray_calls()[-1] == ["stop"]  # Ray stopped on the head all the same: the workers' ray start ends
    assert 60 <= fake.now <= 65
    assert isinstance(e.value, GrpoLabError)  # launch.py prints it without a traceback and records it in status.json


def test_a_head_that_cannot_start_ray_says_which_port():
    fake = FakeRay(head_rc=1)
    _, _, nodes = _head(fake)
    with pytest.raises(slurm.ClusterError, match="(?s)port 6379 taken.*lab.slurm.ray_port=6380"):
        with nodes.running():
            pass
    # no `ray stop`: the Ray that holds the port may be another job's on the same node
    assert fake.ray_calls() == [["start", "--head", "--port=6379", "--num-cpus=16", "--num-gpus=4"]]


def test_a_worker_waits_for_the_head_then_serves_until_it_ends():
    fake = FakeRay()
    looked = []

    def reachable(host, port):
        looked.append((host, port))
        return len(looked) >= 3  # the head's port opens at the third look

    cfg = compose_cfg("hardware=ray_cluster")
    out = slurm.serve_ray_worker(cfg, _env(node="gpu08", rank=1), run=fake, reachable=reachable, sleep=fake.sleep,
                                 clock=fake.clock, ray="ray", head_done=lambda: False)
    assert looked == [("gpu07", 6379)] * 3
    assert fake.ray_calls() == [["start", "--address=gpu07:6379", "--num-cpus=16", "--num-gpus=4", "--block"]]
    assert "gpu08: Ray worker node of gpu07:6379 ended" in out
    # the head's task (and any task outside such a job) runs the job itself
    assert slurm.serve_ray_worker(cfg, _env(), run=fake) is None
    assert slurm.serve_ray_worker(cfg, {}, run=fake) is None


def test_a_worker_gives_up_when_the_head_ended_or_never_came():
    cfg = compose_cfg("hardware=ray_cluster", "lab.slurm.ray_wait_s=30")
    fake = FakeRay()
    out = slurm.serve_ray_worker(cfg, _env(node="gpu08", rank=1), run=fake, reachable=lambda h, p: False,
                                 sleep=fake.sleep, clock=fake.clock, ray="ray", head_done=lambda: True)
    assert "ended before its Ray started" in out and fake.calls == []
    out = slurm.serve_ray_worker(cfg, _env(node="gpu08", rank=1), run=fake, reachable=lambda h, p: False,
                                 sleep=fake.sleep, clock=fake.clock, ray="ray", head_done=lambda: False)
    assert "no Ray head at gpu07:6379 after 30 s" in out and fake.calls == [] and 30 <= fake.now <= 32
    # a job whose nodes do not match its config: the worker says so and starts nothing (the head refuses the job)
    out = slurm.serve_ray_worker(compose_cfg("hardware=ray_cluster", "nnodes=3"), _env(node="gpu08", rank=1),
                                 run=fake, reachable=lambda h, p: True, ray="ray", head_done=lambda: False)
    assert "SLURM gave this job 2 nodes (gpu07,gpu08) but trainer.nnodes=3" in out and fake.calls == []


def test_the_preflight_counts_each_nodes_ray_cpus():
    from grpo_lab.checks.preflight import run_preflight
    from grpo_lab.memory.run import Run

    fake = FakeRay()
    verl, lab = composed("hardware=rtx4080x4", "nnodes=2", "ray_kwargs.ray_init.num_cpus=12")
    _cluster(verl, lab, _env(), run=fake, ray="ray")
    report = run_preflight(Run.build(verl, lab, {}), launching=False)
    [p] = [p for p in report.errors if p.rule == "ray_cpus"]
    assert "needs 14 CPUs per node" in p.message and "has 12 per node" in p.message
    assert "`ray start --num-cpus=12` on each node of SLURM job 4242" in p.message
    assert p.alternatives[0] == "ray_kwargs.ray_init.num_cpus=14"  # re-checked: it passes
    assert not [p for p in report.errors if p.rule in ("ray_join_num_cpus", "ray_nnodes_without_cluster")]
    verl, lab = composed("hardware=ray_cluster")
    _cluster(verl, lab, _env(), run=fake, ray="ray")
    assert not run_preflight(Run.build(verl, lab, {}), launching=False).errors


def _run_py_in_job(tmp_path, env, *args):
    return run_py("hardware=ray_cluster", "experiment=smoke", "train_file=/nonexistent/train.parquet",
                  "test_file=/nonexistent/test.parquet", *args, f"hydra.run.dir={tmp_path}/job", cwd=tmp_path, env=env)


def test_run_py_on_each_node_of_a_two_node_job_plans_without_starting_ray(tmp_path):
    # the head: plans with the cluster's address, each node's CPUs counted; nothing starts (preflight.only)
    p = _run_py_in_job(tmp_path, _env(), "preflight.only=true", "preflight.verbose=true")
    assert planned(p), p.stdout + p.stderr
    assert "Ray CPUs per node: 14 needed, 16 available (`ray start --num-cpus=16` on each node of SLURM job 4242)" \
        in p.stdout
    init = load_yaml(tmp_path / "job" / "verl_config.yaml")["ray_kwargs"]["ray_init"]
    assert init["address"] == "gpu07:6379" and init["num_cpus"] is None
    # the other node: no job of its own (no plan, no status), no Ray either
    (tmp_path / "job").rename(tmp_path / "head")
    p = _run_py_in_job(tmp_path, _env(node="gpu08", rank=1), "preflight.only=true")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "gpu08: planning only" in p.stdout
    assert not (tmp_path / "job" / "plan.json").exists() and not (tmp_path / "job" / "status.json").exists()


def test_run_py_worker_ends_when_the_heads_job_has_ended(tmp_path):
    # the head's job refused (its status.json says failed) before its Ray started: the worker stops waiting
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "status.json").write_text(json.dumps({"status": "failed"}))
    env = _env(node="worker2", rank=1, nodelist="localhost,worker2")
    p = _run_py_in_job(tmp_path, env, "lab.slurm.ray_port=1")  # nothing listens on port 1: never reachable
    assert p.returncode == 0, p.stdout + p.stderr
    assert "worker2: the job on localhost ended before its Ray started" in p.stdout
    assert "ray start" not in p.stdout


def test_a_sweeps_array_task_is_named_as_submitit_names_its_folder():
    env = {**_env(), "SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "1"}
    assert slurm.allocation(env).job_id == "4240_1" and slurm.allocation(_env()).job_id == "4242"


def test_the_real_runner_reports_exit_code_and_output():
    import sys

    assert slurm.run_command([sys.executable, "-c", "print('up'); raise SystemExit(3)"], capture=True) == (3, "up\n")
