"""run.py end to end on a CPU machine: job folders, sweeps, refusals before Ray, and Ray shut down after a job."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest
import yaml
from conftest import fake_gpus, model_folder, planned, run_py

from grpo_lab.facts import load_yaml


def _tiny_files(tmp_path: Path) -> list[str]:
    """Overrides that point the smoke_tiny preset at small files made here (no `make tiny` needed)."""
    from conftest import write_rows

    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    write_rows(train, 64)
    write_rows(test, 8)
    return [f"train_file={train}", f"test_file={test}"]


def _jobs(sweep: Path) -> list[Path]:
    return sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.startswith("job"))


def test_preflight_only_writes_the_plan_and_starts_nothing(tmp_path):
    out = tmp_path / "run"
    proc = run_py("experiment=smoke_tiny", "hardware=h200x1", "preflight.only=true", f"hydra.run.dir={out}",
                  *_tiny_files(tmp_path))
    assert planned(proc), proc.stdout[-3000:] + proc.stderr[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["batch"]["trajectories_per_step"] == 32 * 4
    assert (out / "verl_config.yaml").is_file() and (out / "train.log").is_file()
    assert json.loads((out / "status.json").read_text())["status"] == "ok"
    assert "ray init kwargs" not in proc.stdout  # verl's run_ppo never ran


def test_launch_without_gpus_stops_with_a_clear_message(tmp_path):
    out = tmp_path / "run"
    proc = run_py("experiment=smoke_tiny", "hardware=h200x1", f"hydra.run.dir={out}", *_tiny_files(tmp_path),
                  env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2
    text = proc.stdout + proc.stderr
    assert "GPU" in text and "nothing was started" in text
    assert "Traceback" not in text and "ray init kwargs" not in text
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed" and status["exit"] == 2
    # who ran it: how a "running" status whose process died is told apart later (doctor.gone_running)
    assert status["host"] == socket.gethostname() and isinstance(status["pid"], int) and status["pid"] != os.getpid()


def test_missing_data_is_named_and_no_make_target_that_does_not_write_it(tmp_path):
    # issue 19: `make data` writes data/gsm8k/{train,test}.parquet only: it is no hint for a file of another name
    out = tmp_path / "run"
    proc = run_py("experiment=smoke", f"train_file={tmp_path}/nope.parquet", f"test_file={tmp_path}/nope2.parquet",
                  f"hydra.run.dir={out}")
    assert proc.returncode == 2
    assert f"data.train_files: {tmp_path}/nope.parquet does not exist; nothing in grpo-lab writes this path" \
        in proc.stdout
    assert "make data" not in proc.stdout + proc.stderr and "preflight: OK" not in proc.stdout


def test_misspelt_short_key_is_refused_before_hydra(tmp_path):
    proc = run_py("rollout_gpu_mem_utils=0.5", f"hydra.run.dir={tmp_path}/run")
    assert proc.returncode == 2 and "did you mean 'rollout_gpu_mem_util'" in proc.stderr


def test_sweep_jobs_get_their_own_folders_metrics_and_checkpoints(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_py("-m", "experiment=smoke_tiny", "hardware=h200x1", "preflight.only=true",
                  "rollout_gpu_mem_util=0.3,0.4,0.5", f"hydra.sweep.dir={sweep}", *_tiny_files(tmp_path))
    assert planned(proc), proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = _jobs(sweep)
    assert len(jobs) == 3
    seen = {"utils": set(), "metrics": set(), "ckpt": set()}
    for job in jobs:
        cfg = load_yaml(job / "verl_config.yaml")
        env = cfg["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
        assert env["VERL_FILE_LOGGER_PATH"] == str((job / "metrics.jsonl").resolve())
        seen["utils"].add(cfg["actor_rollout_ref"]["rollout"]["gpu_memory_utilization"])
        seen["metrics"].add(env["VERL_FILE_LOGGER_PATH"])
        seen["ckpt"].add(cfg["trainer"]["default_local_dir"])
        assert (job / "plan.json").is_file()
    assert seen["utils"] == {0.3, 0.4, 0.5}
    assert len(seen["metrics"]) == 3 and len(seen["ckpt"]) == 3


def test_same_command_same_checkpoint_dir(tmp_path):
    dirs = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        proc = run_py("experiment=smoke_tiny", "hardware=h200x1", "preflight.only=true", f"hydra.run.dir={out}",
                      *_tiny_files(tmp_path))
        assert planned(proc), proc.stdout[-2000:] + proc.stderr[-2000:]
        dirs.append(load_yaml(out / "verl_config.yaml")["trainer"]["default_local_dir"])
    # keyed by the experiment, not by Hydra's timestamped job folder: the same command resumes
    assert dirs[0] == dirs[1] and "smoke_tiny" in dirs[0] and str(tmp_path) not in dirs[0]


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_ray_is_shut_down_after_a_failed_or_interrupted_job(monkeypatch, exc):
    import ray
    import verl.trainer.main_ppo as main_ppo
    from conftest import compose_split

    from grpo_lab.launch import job as launch

    def fake_run_ppo(config, task_runner_class):
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        assert ray.is_initialized()
        raise exc

    monkeypatch.setattr(main_ppo, "run_ppo", fake_run_ppo)
    verl, _ = compose_split("experiment=smoke_tiny", "hardware=h200x1", "trainer.device=cpu")
    with pytest.raises(type(exc)):
        launch.run_verl(verl)
    assert not ray.is_initialized()


HEAVY = {"pandas", "numpy", "pyarrow", "torch", "ray", "verl", "vllm", "transformers", "matplotlib"}


def _imported(importtime_output: str) -> set[str]:
    """Top-level package names in `python -X importtime` output."""
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", importtime_output, re.M)
    return {n.split(".")[0] for n in names}


def test_refusal_imports_nothing_heavy(tmp_path):
    # the refusal must come before pandas, torch, ray or verl are imported (each costs seconds); the data files' schema
    # and data_source are read with pyarrow (and the numpy it imports), not with pandas. Once the job's output is
    # teed (grpo_lab/launch/job.py tee_output), importtime's lines come out on stdout
    proc = run_py("ppo_mini_batch_size=7", f"hydra.run.dir={tmp_path}/run", *_tiny_files(tmp_path),
                  env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 2 and "[mini_batch_divisibility]" in proc.stdout, proc.stderr[-2000:]
    imported = _imported(proc.stderr + proc.stdout)
    assert {"hydra", "grpo_lab", "pyarrow"} <= imported  # the importtime lines were read, the preflight's among them
    assert not imported & (HEAVY - {"pyarrow", "numpy"}), sorted(imported & HEAVY)


def test_verl_group_options_still_work_on_the_command_line():
    # verl's ppo_trainer is served composed (grpo_lab/verl_schema/verl_cache.py); run.py walks verl's own tree for these
    proc = run_py("--cfg", "job", "model_engine=veomni")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert yaml.safe_load(proc.stdout)["actor_rollout_ref"]["actor"]["strategy"] == "veomni"
    proc = run_py("--cfg", "job", "actor@actor_rollout_ref.actor=veomni_actor")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert yaml.safe_load(proc.stdout)["actor_rollout_ref"]["actor"]["strategy"] == "veomni"


def test_plan_lists_every_changed_default_with_what_set_it(tmp_path):
    out = tmp_path / "run"
    proc = run_py("experiment=smoke_tiny", "hardware=h200x1", "preflight.only=true", "preflight.verbose=true",
                  f"hydra.run.dir={out}", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
                  *_tiny_files(tmp_path), env={"ROLLOUT_N": "3"})
    assert planned(proc), proc.stdout[-3000:] + proc.stderr[-3000:]
    changed = {c["key"]: c for c in json.loads((out / "plan.json").read_text())["changed_defaults"]}
    # verl's value, ours, and the layer that set it
    assert changed["actor_rollout_ref.rollout.gpu_memory_utilization"] == {
        "key": "actor_rollout_ref.rollout.gpu_memory_utilization", "verl": 0.5, "ours": 0.3, "set_by": "command line"}
    assert changed["actor_rollout_ref.rollout.n"]["set_by"] == "environment (ROLLOUT_N)"
    assert changed["data.train_batch_size"]["set_by"] == "conf/experiment/smoke_tiny.yaml (train_batch_size)"
    assert changed["actor_rollout_ref.rollout.enable_chunked_prefill"] == {
        "key": "actor_rollout_ref.rollout.enable_chunked_prefill", "verl": True, "ours": False,
        "set_by": "conf/config.yaml"}
    assert changed["data.filter_overlong_prompts"]["verl"] is False
    assert "actor_rollout_ref.actor.use_dynamic_bsz" in changed
    assert "trainer.nnodes" not in changed  # 1 is verl's default too
    # every changed value is listed: the verl config minus the listed keys equals verl's defaults there
    from grpo_lab.cli.provenance import verl_defaults
    from grpo_lab.verl_keys import flatten, lookup

    verl = load_yaml(out / "verl_config.yaml")
    defaults = verl_defaults()
    for key, value in flatten(verl):
        if key not in changed and not key.endswith("_target_"):
            assert lookup(defaults, key) == value, key
    # make plan's line: how many, and where
    assert f'{len(changed)} value(s) differ from verl\'s defaults' in proc.stdout
    assert "changed_defaults" in proc.stdout


def test_preflight_only_prints_the_command_that_starts_it(tmp_path):
    # a machine where it would start: its files here, one GPU visible (smoke_tiny runs on sdpa: no flash-attn needed)
    out = tmp_path / "run"
    proc = run_py("experiment=smoke_tiny", "hardware=h200x1", "preflight.only=true", f"hydra.run.dir={out}",
                  *_tiny_files(tmp_path), f"model_path={model_folder(tmp_path / 'model')}", env=fake_gpus(tmp_path))
    assert proc.returncode == 0 and "\npreflight: OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    nxt = [line for line in proc.stdout.splitlines() if line.startswith("next: ")]
    assert nxt and nxt[0].startswith("next: python run.py experiment=smoke_tiny hardware=h200x1 hydra.run.dir=")
    assert "preflight.only" not in nxt[0]


def test_a_failed_jobs_exception_goes_into_its_log(monkeypatch, tmp_path):
    """An exception from verl (a Ray task's error) reaches launch_job after the log's tee has ended: it is appended to
    train.log, so the doctor (and anyone reading the log) sees it."""
    from types import SimpleNamespace

    from hydra.types import RunMode

    from grpo_lab.launch import job as launch

    hc = SimpleNamespace(runtime=SimpleNamespace(output_dir=str(tmp_path)), mode=RunMode.RUN,
                         job=SimpleNamespace(override_dirname=""))
    monkeypatch.setattr(launch.HydraConfig, "get", staticmethod(lambda: hc))

    def boom(*a, **k):
        raise NotImplementedError("offload_to_cpu=True and NO_SHARD is not supported yet")

    monkeypatch.setattr(launch, "run_stages", boom)
    with pytest.raises(NotImplementedError):
        launch.launch_job(None)
    log = (tmp_path / "train.log").read_text()
    assert "grpo-lab: the job raised:" in log and "NotImplementedError: offload_to_cpu=True" in log
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "failed"
