"""The memory planner (grpo_lab/memory/memplan.py): the guide's table, formulas, monotonicity, the GPU benchmark's
wiring."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
from conftest import ROOT, composed, run_py

from grpo_lab.memory import memplan, memplan_phases
from grpo_lab.memory.memplan import Arch, Settings, memory_plan
from grpo_lab.memory.memplan_phases import activations, actor_state_gb_per_gpu, vllm_activation, vllm_weights
from grpo_lab.memory.settings import settings_from_verl


def plan_for(*overrides: str) -> dict:
    verl, lab = composed(*overrides)
    return memory_plan(Arch.from_mapping(asdict(lab.model), "lab.model"), settings_from_verl(verl, lab))


QWEN3_1_7B = Arch(num_hidden_layers=28, hidden_size=2048, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                  intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960)


def base_settings(**kw) -> Settings:
    s = Settings(n_gpus=4, card_gb=32, gpu_memory_utilization=0.4, ppo_max_token_len_per_gpu=3000,
                 max_prompt_length=512, max_response_length=1024, log_prob_max_token_len_per_gpu=4096,
                 ref_log_prob_max_token_len_per_gpu=8192, train_batch_size=128, rollout_n=5, bucket_mb=4096,
                 enable_chunked_prefill=False, max_model_len=1536)
    return replace(s, **kw)


# ---- the guide's table ----------------------------------------------------------------------------------------

def test_parameter_counts_come_from_the_architecture():
    # Qwen3's published sizes: 0.6B (596M with tied embeddings), 1.7B (1.72B), 4B (4.02B), 8B (8.19B)
    assert QWEN3_1_7B.params == pytest.approx(1.7205e9, rel=2e-3)
    v, lab = composed("model=qwen3_8b_lora")
    assert Arch.from_mapping(asdict(lab.model)).params == pytest.approx(8.19e9, rel=5e-3)
    untied = replace(QWEN3_1_7B, tie_word_embeddings=False)
    assert untied.params - QWEN3_1_7B.params == 151936 * 2048


@pytest.mark.parametrize("model,guide_gb", [("qwen3_0_6b", 2.5), ("qwen3_1_7b", 7.0), ("qwen3_4b", 16.0)])
def test_guide_table_actor_state_per_gpu(model, guide_gb):
    """The guide: 16 B/param, divided by FSDP over 4 cards: ~2.5 / ~7 / ~16 GB; vLLM 0.4 x 32 GB = 12.8 GB of the
    card's number, taken by vLLM of its real bytes (32 GiB as CUDA reports it): 13.74e9 bytes."""
    plan = plan_for(f"model={model}")
    assert plan["actor_state_gb_per_gpu"] == pytest.approx(guide_gb, rel=0.06)
    assert plan["actor_state_gb_per_gpu"] == pytest.approx(16 * plan["params"] / 4 / 1e9, abs=0.006)
    assert plan["phases"]["generation"]["components_gb"]["vllm_budget"] == pytest.approx(0.4 * 32 * 2**30 / 1e9,
                                                                                         abs=0.005) == 13.74
    assert plan["fsdp_size"] == 4


def test_guide_table_verdicts():
    assert plan_for("model=qwen3_0_6b")["verdict"]["overall"] == "fits"
    assert plan_for("model=qwen3_1_7b")["verdict"]["overall"] == "fits"
    # the 4B is tight in the guide (conf sets vLLM's max_model_len to prompt + response)
    four = plan_for("model=qwen3_4b")
    assert four["verdict"]["overall"] == "tight"
    assert four["verdict"]["generation"] == "tight"
    # 4B at util 0.85 on 32 GB: 12 GB of resident actor state + 27.2 GB of vLLM cannot share a card
    hot = plan_for("model=qwen3_4b", "rollout_gpu_mem_util=0.85")
    assert hot["verdict"]["generation"] == "oom"
    assert hot["phases"]["generation"]["peak_gb_per_gpu"] > 32
    # full fine-tuning of 8B: its 16 B/param state alone (32.8 GB per card) exceeds the card
    full8 = plan_for("model=qwen3_8b_lora", "actor_rollout_ref.model.lora_rank=0")
    assert full8["actor_state_full_gb_per_gpu"] > 32
    assert full8["verdict"]["training"] == "oom"
    assert any(r["override"].startswith(LORA_TEXT) and r["verdict"] != "oom"
               for r in full8["remedies"]["training"])


LORA_TEXT = ("actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=32 "
             "actor_rollout_ref.rollout.load_format=safetensors")  # verl's LoRA example, as printed


def test_plan_json_keys_the_issue_names():
    plan = plan_for()
    assert isinstance(plan["actor_state_gb_per_gpu"], float)
    for phase in ("generation", "training", "weight_sync"):
        assert isinstance(plan["phases"][phase]["peak_gb_per_gpu"], float)
        assert plan["verdict"][phase] in ("fits", "tight", "oom")
    assert {"tokens", "sequences", "waves"} <= set(plan["kv_cache"])
    assert isinstance(plan["host_ram_gb"], float)
    assert plan["verdict"]["overall"] in ("fits", "tight", "oom")
    json.dumps(plan)  # plain JSON


# ---- formulas -------------------------------------------------------------------------------------------------

def test_kv_cache_bytes_per_token_and_waves():
    a = QWEN3_1_7B
    assert a.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2
    s = base_settings()
    kv = memplan.kv_cache(a, s)
    # vLLM takes util x the card's real bytes: a "32 GB" card is 32 GiB as CUDA reports it
    free = (0.4 * 32 * 2**30 - vllm_weights(a, s) - vllm_activation(a, s)
            - memplan.VLLM_CUDAGRAPH_GB * 1e9)
    assert kv["tokens"] == int(free // a.kv_bytes_per_token)
    assert kv["budget_gb"] == round(0.4 * 32 * 2**30 / 1e9, 2) == 13.74
    assert kv["sequences"] == kv["tokens"] // 1536
    assert kv["replicas"] == 4 and kv["trajectories_per_replica"] == 160
    assert kv["waves"] == -(-160 // min(kv["sequences"], 256))
    # TP 2 halves the KV bytes per token on each GPU and the number of replicas
    kv2 = memplan.kv_cache(a, replace(s, tp=2))
    assert kv2["bytes_per_token"] == a.kv_bytes_per_token / 2 and kv2["replicas"] == 2


def test_vllm_max_model_len_defaults_to_the_models_context():
    """verl leaves max_model_len null -> max_position_embeddings; vLLM must fit one such sequence in its KV cache."""
    a = replace(QWEN3_1_7B, num_hidden_layers=36, hidden_size=2560, num_attention_heads=32, intermediate_size=9728)
    s = base_settings(max_model_len=None)
    kv = memplan.kv_cache(a, s)
    assert kv["max_model_len"] == 40960 and kv["max_num_batched_tokens"] == 40960  # chunked prefill off
    assert not kv["fits_max_model_len"]
    assert memory_plan(a, s)["verdict"]["generation"] == "oom"
    assert memplan.kv_cache(a, replace(s, max_model_len=1536))["fits_max_model_len"]


def test_update_peak_matches_the_h200_measurements():
    """Numbers measured by benchmarks/gpu/memplan_bench.py on an H200 (FSDP2, 1 GPU, 3000 tokens, sdpa), in GiB."""
    measured = {  # (model, gradient checkpointing): update peak, optimizer-step peak
        ("qwen3_0_6b", True): (10.43, 11.17), ("qwen3_0_6b", False): (16.04, 11.10),
        ("qwen3_1_7b", True): (27.84, 32.05), ("qwen3_1_7b", False): (32.15, 32.05),
        ("qwen3_4b", True): (62.93, 75.35), ("qwen3_4b", False): (67.60, 75.34),
    }
    for (model, gc), (update, opt) in measured.items():
        _, lab = composed(f"model={model}")
        a = Arch.from_mapping(asdict(lab.model))
        s = Settings(n_gpus=1, card_gb=150, gradient_checkpointing=gc, attn_implementation="sdpa",
                     ppo_max_token_len_per_gpu=3000, max_prompt_length=512, max_response_length=1024, ref_used=False)
        pred_update = sum(memplan.update_breakdown(a, s).values()) / 2**30
        pred_opt = memplan.optimizer_step_bytes(a, s) / 2**30
        assert pred_update == pytest.approx(update, rel=0.05), (model, gc)
        assert pred_opt == pytest.approx(opt, rel=0.05), (model, gc)


# ---- monotonicity ---------------------------------------------------------------------------------------------

def peaks(a: Arch, s: Settings) -> dict[str, float]:
    p = memory_plan(a, s, remedies=False)
    return {k: v["peak_gb_per_gpu"] for k, v in p["phases"].items()}


def test_higher_util_more_generation_memory_and_more_kv():
    a = QWEN3_1_7B
    lo, hi = base_settings(gpu_memory_utilization=0.4), base_settings(gpu_memory_utilization=0.6)
    assert peaks(a, hi)["generation"] > peaks(a, lo)["generation"]
    assert memplan.kv_cache(a, hi)["tokens"] > memplan.kv_cache(a, lo)["tokens"]
    # with free_cache_engine off, vLLM keeps its budget through training too
    assert (peaks(a, replace(hi, free_cache_engine=False))["training"]
            > peaks(a, replace(lo, free_cache_engine=False))["training"] > peaks(a, lo)["training"])


def test_more_tokens_more_training_memory():
    a = QWEN3_1_7B
    values = [peaks(a, base_settings(ppo_max_token_len_per_gpu=t, log_prob_max_token_len_per_gpu=t,
                                     ref_log_prob_max_token_len_per_gpu=t))["training"] for t in (2048, 4096, 8192)]
    assert values[0] < values[1] < values[2]
    # without gradient checkpointing the activations grow much faster with tokens
    s = base_settings(ppo_max_token_len_per_gpu=8192)
    assert activations(a, replace(s, gradient_checkpointing=False), 8192) > 10 * activations(a, s, 8192)


def test_bigger_model_more_memory():
    s = base_settings()
    archs = [Arch.from_mapping(asdict(composed(f"model={m}")[1].model))
             for m in ("qwen3_0_6b", "qwen3_1_7b", "qwen3_4b")]
    for small, big in zip(archs, archs[1:]):
        ps, pb = peaks(small, s), peaks(big, s)
        assert all(pb[k] > ps[k] for k in ps), (ps, pb)
        assert actor_state_gb_per_gpu(big, s) > actor_state_gb_per_gpu(small, s)


def test_offload_and_lora_less_memory():
    a, s = QWEN3_1_7B, base_settings()
    base = peaks(a, s)
    opt = peaks(a, replace(s, optimizer_offload=True))
    assert opt["generation"] < base["generation"] and opt["weight_sync"] < base["weight_sync"]
    assert actor_state_gb_per_gpu(a, replace(s, optimizer_offload=True)) < actor_state_gb_per_gpu(a, s)
    # verl loads an offloaded optimizer back for the update: the update peak itself does not move
    assert opt["training"] == pytest.approx(base["training"], abs=0.01)
    par = peaks(a, replace(s, param_offload=True))
    assert par["generation"] < base["generation"]
    lora = peaks(a, replace(s, lora_rank=64))
    assert all(lora[k] < base[k] for k in ("generation", "training", "weight_sync")), (lora, base)
    assert actor_state_gb_per_gpu(a, replace(s, lora_rank=64)) < 0.4 * actor_state_gb_per_gpu(a, s)
    # offloading moves bytes into host RAM
    assert (memplan.host_ram(a, replace(s, optimizer_offload=True))["steady_gb"]
            > memplan.host_ram(a, s)["steady_gb"])


def test_lora_adapter_count():
    # rank r on every linear layer: r x (in + out) per layer
    a = QWEN3_1_7B
    per_layer = sum(i + o for i, o in a.linear_shapes().values())
    assert a.lora_params(64) == 28 * 64 * per_layer
    assert a.lora_params(64, ["q_proj", "v_proj"]) == 28 * 64 * ((2048 + 2048) + (2048 + 1024))
    assert a.lora_params(0) == 0


def test_remedies_follow_the_guides_order_and_fix_the_phase():
    a = QWEN3_1_7B
    s = base_settings(card_gb=16, ppo_max_token_len_per_gpu=16384, log_prob_max_token_len_per_gpu=16384,
                      ref_log_prob_max_token_len_per_gpu=16384)
    plan = memory_plan(a, s)
    assert plan["verdict"]["training"] in ("oom", "tight")
    overrides = [r["override"] for r in plan["remedies"]["training"]]
    assert overrides and overrides[0].startswith("ppo_max_token_len_per_gpu=")  # the token budget comes first
    budget = int(overrides[0].split()[0].split("=")[1])
    assert 1536 <= budget < 16384
    assert plan["remedies"]["training"][0]["peak_gb_per_gpu"] < plan["phases"]["training"]["peak_gb_per_gpu"]
    # generation OOM from a high util: the util remedy names a value that fits
    hot = memory_plan(a, base_settings(gpu_memory_utilization=0.95))
    util = [r for r in hot["remedies"]["generation"] if r["override"].startswith("rollout_gpu_mem_util=")]
    assert util and util[0]["verdict"] == "fits" and float(util[0]["override"].split("=")[1]) < 0.95


# ---- the GPU benchmark's CPU mode -------------------------------------------------------------------------------

def test_gpu_benchmark_tiny_cpu_mode(tmp_path):
    """benchmarks/gpu/memplan_bench.py runs end to end on CPU with the tiny model (FSDP2 over gloo) and writes JSON
    holding the planner's predictions for every row (the GPU run fills in the measured side)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("memplan_bench", ROOT / "benchmarks" / "gpu" / "memplan_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    assert bench.main(["--device", "cpu", "--tiny", "--entropy", "eager", "--steps", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert len(report["rows"]) == 2
    for row in report["rows"]:
        assert row["predicted"]["update"] > row["predicted"]["resident"] > 0
        assert set(row["measured"]) == {"update", "opt_step", "resident", "log_prob"}
    assert "predicted GiB" in report["table"]
    # the full matrix the GPU run covers: 3 models x checkpointing on/off x optimizer offload on/off
    args = bench.argparse.Namespace(tiny=False, quick=False, models="0.6b,1.7b,4b")
    assert len(bench.rows_for(args)) == 12


def test_fused_log_prob_holds_one_chunk_of_logits_whatever_the_budget():
    # verl's FusedLinearForPPO (speed=fused) takes log-probs 512 tokens at a time: the budget no longer scales logits
    a = QWEN3_1_7B
    loop = [memplan_phases.update_peaks(a, base_settings(ppo_max_token_len_per_gpu=t))["backward_start"]["logits"]
            for t in (4096, 32768)]
    fused = [memplan_phases.update_peaks(a, base_settings(ppo_max_token_len_per_gpu=t, use_fused_kernels=True))
             ["backward_start"]["logits"] for t in (4096, 32768)]
    assert loop[1] == pytest.approx(8 * loop[0])
    assert fused[0] == fused[1] == pytest.approx(512 * a.vocab_size * memplan_phases.FUSED_BACKWARD_BYTES)
    assert fused[1] < loop[1] / 10
    # a micro-batch shorter than a chunk holds only its own tokens
    short = memplan_phases.update_peaks(a, base_settings(ppo_max_token_len_per_gpu=300, use_fused_kernels=True))
    per_token = a.vocab_size * memplan_phases.FUSED_BACKWARD_BYTES
    assert short["backward_start"]["logits"] == pytest.approx(300 * per_token)


def test_run_py_plans_large_budgets_with_the_fused_log_prob_and_refuses_them_without(tmp_path):
    # the 1.7B LoRA smoke on an emulated 32 GB card, every pass at 32,768 tokens: the loop's logits (6 B x T x vocab)
    # do not fit there; verl's fused log-prob keeps one chunk's and does
    base = ["experiment=smoke", "model=qwen3_1_7b", "hardware=h200x1", "lab.hardware.gpu_memory_gb=32",
            "lab.hardware.emulate.real_gpu_memory_gb=139.8", "dataset=arith_tiny",
            "actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.model.lora_alpha=32",
            "actor_rollout_ref.rollout.load_format=safetensors",
            "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768",
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768",
            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=32768", "preflight.only=true"]
    guide = run_py(*base, "speed=guide", f"hydra.run.dir={tmp_path / 'guide'}")
    fused = run_py(*base, "speed=fused", f"hydra.run.dir={tmp_path / 'fused'}")
    assert guide.returncode == 2, guide.stdout + guide.stderr
    assert "logits" in guide.stdout and "oom" in guide.stdout
    assert fused.returncode == 3, fused.stdout + fused.stderr
    plan = json.loads((tmp_path / "fused" / "plan.json").read_text())
    assert plan["memory"]["phases"]["training"]["verdict"] == "fits"
    update = plan["memory"]["phases"]["training"]
    assert update["peak_gb_per_gpu"] < 0.8 * 32
