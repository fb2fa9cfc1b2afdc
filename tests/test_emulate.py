"""Emulation (grpo_lab/memory/emulate.py): the course machine's 32 GB cards rehearsed on bigger ones, through run.py.

What a user types (`python run.py hardware=h200x4_as_rtx4080x4 ...`) in a subprocess; what verl would get is read
back from the job's verl_config.yaml, what the preflight planned from its plan.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import planned, run_py
from omegaconf import OmegaConf

from grpo_lab.facts import load_yaml
from grpo_lab.memory import emulate
from grpo_lab.verl_keys import get

H200 = 139.8
FRACTION = 32 / H200  # 0.228898...
EMU = "hardware=h200x4_as_rtx4080x4"
ENV = "ray_kwargs.ray_init.runtime_env.env_vars"
UTIL = "actor_rollout_ref.rollout.gpu_memory_utilization"


def _plan(tmp_path: Path, *args: str, env: dict | None = None, name: str = "run"):
    out = tmp_path / name
    p = run_py(*args, "preflight.only=true", "preflight.verbose=true", f"hydra.run.dir={out}", env=env, cwd=tmp_path)
    return p, out


def _written(out: Path) -> tuple[dict, dict]:
    return load_yaml(out / "verl_config.yaml"), json.loads((out / "plan.json").read_text())


def test_the_plan_is_for_32_gb_cards_and_says_emulated(tmp_path):
    p, out = _plan(tmp_path, EMU)
    assert planned(p), p.stdout[-3000:] + p.stderr[-3000:]
    verl, plan = _written(out)
    # planned for the course machine's cards, with the guide's util 0.4 of 32 GB
    assert plan["memory"]["card_gb"] == 32 and plan["memory"]["n_gpus"] == 4
    # vLLM takes 0.4 of the card's real bytes: 32 GiB as CUDA reports it = 34.36e9 bytes
    assert plan["memory"]["phases"]["generation"]["components_gb"]["vllm_budget"] == pytest.approx(13.74)
    assert "Memory plan per GPU (32 GB cards, 4 GPU(s)" in p.stdout
    # said plainly, with the real values
    assert "EMULATED: planned for 32 GB cards (RTX 4080 32GB), running on 139.8 GB cards (H200)" in p.stdout
    assert "0.091559 of 139.8 GB" in p.stdout and "per_process_memory_fraction:0.228898" in p.stdout
    emu = plan["emulation"]
    assert emu["real_gpu_memory_gb"] == H200 and emu["card_gb"] == 32
    assert emu["torch_cap_gb_per_process"] == pytest.approx(32.0)
    assert emu["gpu_memory_utilization"][UTIL] == {"planned": 0.4, "handed_to_engine": 0.091559, "budget_gb": 13.74}
    assert any(n.startswith("EMULATED") for n in plan["notes"])
    cap = next(i for i in plan["changed_defaults"] if i["key"] == f"{ENV}.PYTORCH_CUDA_ALLOC_CONF")
    assert cap["set_by"].startswith("emulation (grpo_lab/memory/emulate.py)")
    # what verl gets: vLLM's budget of a 32 GB card out of the H200's total, the cap, the GeForce NCCL setting
    assert get(verl, UTIL) == pytest.approx(0.4 * FRACTION, abs=1e-6)
    assert get(verl, UTIL) * H200 == pytest.approx(12.8, abs=1e-3)
    env = get(verl, ENV)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "per_process_memory_fraction:0.228898"
    assert float(env["PYTORCH_CUDA_ALLOC_CONF"].split(":")[1]) * H200 == pytest.approx(32.0, abs=1e-3)
    assert "PYTORCH_ALLOC_CONF" not in env  # only when the user set that name
    assert env["NCCL_P2P_DISABLE"] == "1"
    # the course machine's CPU and RAM facts, and Ray's CPUs as on it
    assert verl["ray_kwargs"]["ray_init"]["num_cpus"] == 16
    hydra_cfg = load_yaml(out / ".hydra" / "config.yaml")
    hw = hydra_cfg["lab"]["hardware"]
    assert (hw["cpu_cores"], hw["host_ram_gb"], hw["p2p"], hw["gpu_memory_gb"]) == (16, 128, False, 32)


@pytest.mark.parametrize("override", ["rollout_gpu_mem_util=0.5", f"{UTIL}=0.5"])
def test_a_utilization_on_the_command_line_means_the_small_card(tmp_path, override):
    p, out = _plan(tmp_path, EMU, override)
    assert planned(p), p.stdout[-3000:] + p.stderr[-3000:]
    verl, plan = _written(out)
    assert plan["memory"]["phases"]["generation"]["components_gb"]["vllm_budget"] == pytest.approx(17.18)  # GiB
    assert get(verl, UTIL) == pytest.approx(0.5 * FRACTION, abs=1e-6)  # 0.114449 x 139.8 GB = 16 GB
    assert plan["emulation"]["gpu_memory_utilization"][UTIL]["planned"] == 0.5
    # the values that differ from verl's defaults are what verl gets, and say that emulation scaled them
    item = next(i for i in plan["changed_defaults"] if i["key"] == UTIL)
    assert item["verl"] == 0.5 and item["ours"] == pytest.approx(0.5 * FRACTION, abs=1e-6)
    assert "emulation (grpo_lab/memory/emulate.py) scaled 0.5 of a 32 GB card to 0.114449 of 139.8 GB" in item["set_by"]


def test_a_sweep_scales_every_job(tmp_path):
    sweep = tmp_path / "sweep"
    p = run_py("-m", EMU, "rollout_gpu_mem_util=0.3,0.5", "preflight.only=true", f"hydra.sweep.dir={sweep}",
               cwd=tmp_path)
    assert planned(p), p.stdout[-3000:] + p.stderr[-3000:]
    got = {}
    for job in sorted(sweep.glob("job*")):
        verl, plan = _written(job)
        u = plan["emulation"]["gpu_memory_utilization"][UTIL]["planned"]
        got[u] = get(verl, UTIL)
    assert got == pytest.approx({0.3: 0.3 * FRACTION, 0.5: 0.5 * FRACTION}, abs=1e-6)


def test_the_users_allocator_settings_are_merged_not_overwritten(tmp_path):
    user = "expandable_segments:False,roundup_power2_divisions:[256:1,512:2,>:4]"
    p, out = _plan(tmp_path, EMU, env={"PYTORCH_CUDA_ALLOC_CONF": user}, name="shell")
    assert planned(p), p.stdout[-3000:] + p.stderr[-3000:]
    env = get(_written(out)[0], ENV)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == user + ",per_process_memory_fraction:0.228898"
    # set in the job's own env_vars (they override the shell's in Ray's workers): merged too
    p, out = _plan(tmp_path, EMU, f"+{ENV}.PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512",
                   env={"PYTORCH_CUDA_ALLOC_CONF": user}, name="config")
    assert planned(p), p.stdout[-3000:] + p.stderr[-3000:]
    assert get(_written(out)[0], ENV)["PYTORCH_CUDA_ALLOC_CONF"] == \
        "max_split_size_mb:512,per_process_memory_fraction:0.228898"
    # the new name (torch reads PYTORCH_CUDA_ALLOC_CONF first): carried over, and both names get the merged value
    p, out = _plan(tmp_path, EMU, env={"PYTORCH_ALLOC_CONF": "max_split_size_mb:256"}, name="newname")
    env = get(_written(out)[0], ENV)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == env["PYTORCH_ALLOC_CONF"] == \
        "max_split_size_mb:256,per_process_memory_fraction:0.228898"
    # a user's own fraction wins, and the plan says so
    p, out = _plan(tmp_path, EMU, env={"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.3"}, name="own")
    assert get(_written(out)[0], ENV)["PYTORCH_CUDA_ALLOC_CONF"] == "per_process_memory_fraction:0.3"
    assert "your own per_process_memory_fraction, kept" in p.stdout and "41.94 GB per process" in p.stdout


@pytest.mark.parametrize("args,env,words", [
    ([], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "Expandable segments are not compatible"),
    (["lab.hardware.emulate.real_gpu_memory_gb=16"], {}, "cannot emulate a 32 GB card on 16 GB cards"),
    (["actor_rollout_ref.rollout.name=sglang"], {}, "actor_rollout_ref.rollout.name=vllm"),
])
def test_bad_emulation_input_is_refused_before_anything_is_written(tmp_path, args, env, words):
    p, out = _plan(tmp_path, EMU, *args, env=env)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert words in p.stderr and "Traceback" not in p.stderr
    assert not (out / "verl_config.yaml").exists() and not (out / "plan.json").exists()


def test_no_number_for_the_real_card_fails_at_compose(tmp_path):
    """lab.hardware.emulate.real_gpu_memory_gb is typed (grpo_lab/labconf.py): Hydra's own error names the key."""
    p, out = _plan(tmp_path, EMU, "lab.hardware.emulate.real_gpu_memory_gb=lots")
    assert p.returncode == 1 and "Traceback" not in p.stdout + p.stderr, p.stderr[-2000:]
    assert "full_key: lab.hardware.emulate.real_gpu_memory_gb" in p.stderr and "converted to Float" in p.stderr
    assert not (out / "verl_config.yaml").exists() and not (out / "plan.json").exists()


def test_any_smaller_card_on_any_bigger_one(tmp_path):
    # a 32 GB box rehearsed on A100 80GB, from the A100 option: the same mechanism
    p, out = _plan(tmp_path, "hardware=a100_80gbx8", "ngpus_per_node=4", "lab.hardware.gpu_memory_gb=32",
                   "lab.hardware.emulate.real_gpu_memory_gb=80")
    assert planned(p), p.stdout[-3000:] + p.stderr[-3000:]
    verl, plan = _written(out)
    assert plan["memory"]["card_gb"] == 32
    assert get(verl, UTIL) == pytest.approx(0.16)  # 0.4 x 32 / 80
    assert get(verl, ENV)["PYTORCH_CUDA_ALLOC_CONF"] == "per_process_memory_fraction:0.4"


def test_without_emulation_nothing_changes(tmp_path):
    p, out = _plan(tmp_path, "hardware=rtx4080x4")
    assert planned(p), p.stdout[-3000:] + p.stderr[-3000:]
    verl, plan = _written(out)
    assert get(verl, UTIL) == 0.4 and "emulation" not in plan and "EMULATED" not in p.stdout
    assert "PYTORCH_CUDA_ALLOC_CONF" not in get(verl, ENV)


def test_verl_validates_what_it_would_get(tmp_path):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    p, out = _plan(tmp_path, EMU)
    assert planned(p), p.stdout[-3000:] + p.stderr[-3000:]
    cfg = OmegaConf.create(_written(out)[0])
    OmegaConf.set_struct(cfg, True)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.gpu_memory_utilization == pytest.approx(0.4 * FRACTION, abs=1e-6)
    assert cfg.trainer.n_gpus_per_node == 4


def test_the_torch_library_check_reads_the_key(tmp_path, monkeypatch):
    import importlib.util
    from types import SimpleNamespace

    lib = tmp_path / "torch" / "lib"
    lib.mkdir(parents=True)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: SimpleNamespace(submodule_search_locations=[str(tmp_path / "torch")]))
    emulate.torch_knows_fraction_key.cache_clear()
    assert emulate.torch_knows_fraction_key() is None  # no CUDA library: a CPU build
    (lib / "libc10_cuda.so").write_bytes(b"\0Unrecognized CachingAllocator option: \0")
    emulate.torch_knows_fraction_key.cache_clear()
    assert emulate.torch_knows_fraction_key() is False
    (lib / "libc10_cuda.so").write_bytes(b"\0per_process_memory_fraction is invalid, set it in [0.0, 1.0]\0")
    emulate.torch_knows_fraction_key.cache_clear()
    assert emulate.torch_knows_fraction_key() is True
    emulate.torch_knows_fraction_key.cache_clear()


def test_allocator_strings_keep_bracketed_lists():
    s = "roundup_power2_divisions:[256:1,512:2,>:4],expandable_segments:False"
    assert emulate.parse_alloc_conf(s) == [("roundup_power2_divisions", "[256:1,512:2,>:4]"),
                                           ("expandable_segments", "False")]
    assert emulate.merge_alloc_conf(s, 0.25) == s + ",per_process_memory_fraction:0.25"
    assert emulate.merge_alloc_conf(None, 0.25) == "per_process_memory_fraction:0.25"
    with pytest.raises(emulate.EmulationError, match="key:value"):
        emulate.parse_alloc_conf("expandable_segments")


def test_raw_verl_gets_the_same_emulated_values(tmp_path):
    # benchmarks/gpu/README.md compares run.py with raw verl under emulation:
    # python -m grpo_lab.launch.rawcmd hardware=...
    import subprocess
    import sys

    from conftest import ROOT
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from grpo_lab.launch.prepare import split
    from grpo_lab.verl_schema.verl_paths import verl_config_dir

    raw = subprocess.run([sys.executable, "-m", "grpo_lab.launch.rawcmd", "--list", EMU, "rollout_gpu_mem_util=0.5"],
                         cwd=ROOT, text=True, capture_output=True, timeout=120)
    assert raw.returncode == 0, raw.stderr
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        raw_verl, _ = split(compose("ppo_trainer", overrides=raw.stdout.splitlines()))
    GlobalHydra.instance().clear()
    p, out = _plan(tmp_path, EMU, "rollout_gpu_mem_util=0.5")
    ours = _written(out)[0]
    assert get(raw_verl, UTIL) == get(ours, UTIL) == pytest.approx(0.5 * FRACTION, abs=1e-6)
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "NCCL_P2P_DISABLE"):
        assert get(raw_verl, ENV)[var] == get(ours, ENV)[var]
    assert raw_verl["ray_kwargs"]["ray_init"]["num_cpus"] == 16
    # a refusal is a message there too
    bad = subprocess.run([sys.executable, "-m", "grpo_lab.launch.rawcmd", EMU,
                          "lab.hardware.emulate.real_gpu_memory_gb=16"], cwd=ROOT, text=True, capture_output=True,
                         timeout=120)
    assert bad.returncode == 2 and "cannot emulate a 32 GB card on 16 GB cards" in bad.stderr


def test_one_transform_gives_the_planned_and_the_handed_config_and_leaves_its_input(tmp_path):
    from conftest import composed

    from grpo_lab.verl_keys import freeze

    verl, lab = composed(EMU)
    before = json.dumps(verl, sort_keys=True)
    done = emulate.emulate(verl, lab, {})
    assert json.dumps(verl, sort_keys=True) == before  # the input as it was
    assert get(done.planned, UTIL) == 0.4 and get(done.verl, UTIL) == pytest.approx(0.4 * FRACTION, abs=1e-6)
    cap = "per_process_memory_fraction:0.228898"
    assert get(done.planned, ENV)["PYTORCH_CUDA_ALLOC_CONF"] == get(done.verl, ENV)["PYTORCH_CUDA_ALLOC_CONF"] == cap
    assert done.info["gpu_memory_utilization"][UTIL]["handed_to_engine"] == get(done.verl, UTIL)
    # what verl gets shares nothing with the plan: a later change to it (the side-by-side KV pin) is verl's alone
    done.verl["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"]["x"] = 1
    assert "x" not in done.planned["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"]
    # the preflight's rules read a read-only view: the same result from it, and again from what it planned
    again = emulate.emulate(freeze(done.planned), lab, {})
    assert again.info == done.info and emulate.describe(again) == emulate.describe(done)
    # without emulation: the input itself, twice
    lab.hardware.emulate.real_gpu_memory_gb = None
    plain = emulate.emulate(verl, lab, {})
    assert plain.planned is verl and plain.verl is verl and plain.info is None and emulate.describe(plain) == ""
