"""SGLang rollout: the rollout options compose into verl's SGLang keys, verl accepts them, and the memory plan reads
gpu_memory_utilization the way SGLang does (a fraction of the memory free at engine start, for weights + KV cache)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
from conftest import composed, options, planned, run_py
from omegaconf import OmegaConf

from grpo_lab.facts import load_yaml
from grpo_lab.memory import engines, memplan
from grpo_lab.memory.memplan import Arch, memory_plan
from grpo_lab.memory.settings import settings_from_verl
from grpo_lab.verl_keys import get

SGLANG = ["sglang_tp1_mem04", "sglang_tp2_mem04"]


def _plan(*overrides):
    verl, lab = composed(*overrides)
    arch, s = Arch.from_mapping(asdict(lab.model), "lab.model"), settings_from_verl(verl, lab)
    return arch, s, memory_plan(arch, s, remedies=False)


# ---- the arithmetic -----------------------------------------------------------------------------------------------

def test_static_budget_per_engine():
    # vLLM: of the card's total, whatever else is on it
    assert engines.static_budget_gb("vllm", 0.4, 32, 0) == pytest.approx(12.8)
    assert engines.static_budget_gb("vllm", 0.4, 32, 10) == pytest.approx(12.8)
    # SGLang: of what is free when it starts
    assert engines.static_budget_gb("sglang", 0.4, 32, 0) == pytest.approx(12.8)
    assert engines.static_budget_gb("sglang", 0.4, 32, 10) == pytest.approx(8.8)
    assert engines.static_budget_gb("sglang", 0.5, 32, 40) == 0.0
    assert engines.budget_holds_activations("vllm") and not engines.budget_holds_activations("sglang")
    with pytest.raises(ValueError, match="knows vllm, sglang"):
        engines.static_budget_gb("trtllm", 0.4, 32, 0)


def test_explanation_names_both_readings_with_numbers():
    text = engines.explain("sglang", 0.4, 32, 2.0)
    assert "0.4 x 30.00 GB free at engine start" in text and "= 12.00 GB for its weights and KV cache" in text
    assert "remaining 18.00 GB" in text and "under vLLM would be 12.80 GB" in text
    assert "0.4 x 32 GB card (total) = 12.80 GB" in engines.explain("vllm", 0.4, 32, 2.0)


# ---- the plan ------------------------------------------------------------------------------------------------------

def test_sglang_plan_uses_free_memory_at_engine_start():
    arch, s, plan = _plan("rollout=sglang_tp1_mem04")
    assert s.rollout_engine == "sglang" and s.tp == 1 and s.gpu_memory_utilization == 0.4
    # on the card when the engine starts: the actor's fp32 parameter shard (AdamW's moments come at the first step)
    # and the two CUDA contexts
    at_start = 4 * arch.params / 4 / 1e9 + memplan.TRAINER_CUDA_CONTEXT_GB + memplan.VLLM_CUDA_CONTEXT_GB
    assert at_start == pytest.approx(3.87, abs=0.01)  # Qwen3-1.7B over 4 cards: 1.72 GB + 1.25 + 0.9
    kv = plan["kv_cache"]
    # of the card's real bytes (a "32 GB" card: 32 GiB as CUDA reports it, 34.36e9 bytes)
    assert kv["engine"] == "sglang" and kv["budget_gb"] == round(0.4 * (32 * 2**30 / 1e9 - at_start), 2) == 12.2
    # the static budget holds weights and KV only: no activation or CUDA graph taken out of it
    assert kv["kv_cache_gb"] == pytest.approx(kv["budget_gb"] - kv["vllm_weights_gb"], abs=0.02)
    assert "free at engine start" in kv["budget_rule"]
    gen = plan["phases"]["generation"]["components_gb"]
    assert gen["sglang_static"] == kv["budget_gb"] and gen["sglang_activations"] > 0 and "vllm_budget" not in gen
    assert plan["phases"]["generation"]["peak_gb_per_gpu"] == pytest.approx(sum(gen.values()), abs=0.02)


def test_same_number_different_memory_vllm_vs_sglang():
    _, _, v = _plan()  # the default: vLLM TP 1 at 0.4
    _, _, g = _plan("rollout=sglang_tp1_mem04")
    kv_v, kv_g = v["kv_cache"], g["kv_cache"]
    assert kv_v["engine"] == "vllm" and kv_v["budget_gb"] == 13.74  # 0.4 x 32 GiB
    # vLLM's 13.74 GB also carries its activations and CUDA graphs; SGLang's 12.2 GB only weights and KV
    assert kv_v["kv_cache_gb"] == pytest.approx(13.74 - kv_v["vllm_weights_gb"] - kv_v["vllm_activation_gb"]
                                                - kv_v["cudagraph_gb"], abs=0.02)
    assert kv_g["budget_gb"] < kv_v["budget_gb"]
    assert kv_g["kv_cache_gb"] > kv_v["kv_cache_gb"] - 1.5
    assert v["phases"]["generation"]["components_gb"]["vllm_budget"] == 13.74
    # both fit on the course machine at the guide's 0.4
    assert v["verdict"]["generation"] == g["verdict"]["generation"] == "fits"


def test_offloading_the_actor_grows_sglangs_budget_not_vllms():
    arch, s, _ = _plan("rollout=sglang_tp1_mem04")
    off = replace(s, param_offload=True)
    g_on = memplan.kv_cache(arch, s)["budget_gb"]
    g_off = memplan.kv_cache(arch, off)["budget_gb"]
    assert g_off == pytest.approx(g_on + 0.4 * 4 * arch.params / 4 / 1e9, abs=0.02)
    v = replace(s, rollout_engine="vllm")
    assert memplan.kv_cache(arch, v)["budget_gb"] == memplan.kv_cache(arch, replace(v, param_offload=True))["budget_gb"]


def test_sglang_high_fraction_runs_out_where_the_rest_is_too_small():
    # 0.95 of the free memory leaves too little for SGLang's activations once AdamW's moments are on the card too
    arch, s, _ = _plan("rollout=sglang_tp1_mem04", "rollout_gpu_mem_util=0.95")
    plan = memory_plan(arch, s)
    assert plan["verdict"]["generation"] == "oom"
    fixes = [r["override"] for r in plan["remedies"]["generation"]]
    assert any(f.startswith("rollout_gpu_mem_util=") for f in fixes)


def test_tp2_halves_sglangs_weights():
    _, _, one = _plan("rollout=sglang_tp1_mem04")
    _, _, two = _plan("rollout=sglang_tp2_mem04")
    assert two["kv_cache"]["vllm_weights_gb"] == pytest.approx(one["kv_cache"]["vllm_weights_gb"] / 2, abs=0.01)
    assert two["kv_cache"]["replicas"] == 2 and one["kv_cache"]["replicas"] == 4


# ---- composition and verl's own checks -----------------------------------------------------------------------------

def test_option_names_do_not_clash_with_verls_rollout_files():
    from pathlib import Path

    from grpo_lab.verl_schema.verl_paths import verl_config_dir

    theirs = {p.stem for p in (Path(verl_config_dir()) / "rollout").glob("*.yaml")}
    assert set(SGLANG) <= set(options("rollout")) and not set(SGLANG) & theirs and "rollout" not in SGLANG


@pytest.mark.parametrize("option,tp", [("sglang_tp1_mem04", 1), ("sglang_tp2_mem04", 2)])
def test_verl_validates_the_sglang_config(option, tp):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    verl, _ = composed(f"rollout={option}")
    cfg = OmegaConf.create(verl)
    OmegaConf.set_struct(cfg, True)  # as grpo_lab/launch/job.py:run_verl hands it to verl
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.name == "sglang" and rollout.tensor_model_parallel_size == tp
    assert rollout.gpu_memory_utilization == 0.4  # what verl hands SGLang as mem_fraction_static


def test_run_py_composes_and_plans_sglang(tmp_path):
    p = run_py("rollout=sglang_tp2_mem04", "preflight.only=true", "preflight.verbose=true", cwd=tmp_path)
    assert planned(p), p.stdout + p.stderr
    assert "sglang static" in p.stdout and "sglang activations" in p.stdout
    job = next((tmp_path / "outputs" / "runs").iterdir())
    sent = load_yaml(job / "verl_config.yaml")
    assert get(sent, "actor_rollout_ref.rollout.name") == "sglang"
    assert get(sent, "actor_rollout_ref.rollout.tensor_model_parallel_size") == 2
    assert get(sent, "actor_rollout_ref.rollout.gpu_memory_utilization") == 0.4
    plan = json.loads((job / "plan.json").read_text())
    assert plan["memory"]["kv_cache"]["engine"] == "sglang"
    assert "free at engine start" in plan["memory"]["kv_cache"]["budget_rule"]
