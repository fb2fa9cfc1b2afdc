"""More than one machine: hardware=ray_cluster joins a running Ray cluster; hydra/launcher=slurm sizes one SLURM job
per sweep point from the hardware option. Nothing is submitted here (no SLURM on the test machine)."""

from __future__ import annotations

import yaml
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import compose_cfg, compose_split, run_py
from grpo_lab import slurm
from grpo_lab.config import get


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
    assert lab["hardware"]["gpu_memory_gb"] == 32 and lab["hardware"]["cpu_cores"] == 16  # per node
    cfg = OmegaConf.create(verl)
    OmegaConf.set_struct(cfg, True)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node == 8


def test_one_node_cluster_plans_through_run_py(tmp_path):
    # joining a one-node cluster: the preflight counts the node's 16 cores (3 x 4 GPUs + 4 = 16)
    p = run_py("hardware=ray_cluster", "nnodes=1", "preflight.only=true", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "on ray_cluster" in p.stdout and "preflight: OK" in p.stdout


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
    assert "no `sbatch` here" in p.stderr and "Nothing was submitted; the 3 job(s) would have been sent with" in p.stderr
    for line in ("#SBATCH --array=0-2%3", "#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=16",
                 "#SBATCH --mem=128GB", "#SBATCH --partition=gpu", "#SBATCH --nodes=1"):
        assert line in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "outputs" / "sweeps").exists() or not any((tmp_path / "outputs" / "sweeps").iterdir())


def test_run_py_refuses_more_than_one_node_per_slurm_job(tmp_path):
    p = run_py("-m", "hydra/launcher=slurm", "hardware=ray_cluster", "nnodes=2", cwd=tmp_path)
    assert p.returncode == 2
    assert "trainer.nnodes=2: grpo-lab runs one node per SLURM job" in p.stderr and "Nothing was submitted" in p.stderr
    assert "hardware=ray_cluster nnodes=2" in p.stderr and "Traceback" not in p.stderr


def test_a_sweep_over_hardware_is_refused():
    params = {"nodes": 1, "gpus_per_node": 4, "cpus_per_task": 16, "mem_gb": 128}
    why = slurm.refusal(params, [["hardware=rtx4080x4", "x=1"], ["hardware=h200x1", "x=1"]])
    assert "this sweep changes hardware (h200x1, rtx4080x4)" in why and "one sweep per value" in why
    assert slurm.refusal(params, [["hardware=h200x1", "x=1"], ["hardware=h200x1", "x=2"]]) is None
