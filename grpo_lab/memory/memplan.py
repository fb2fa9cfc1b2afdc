"""Memory plan: what one GRPO step of verl 0.9.1 (FSDP actor + colocated vLLM) puts on each GPU and in host RAM.

Pure functions on plain data: no torch, no verl, no I/O. `grpo_lab.checks.preflight` feeds it the composed config;
`benchmarks/gpu/memplan_bench.py` compares it with torch's allocator on a real GPU.

Units: GB = 1e9 bytes, the guide's unit ("16 B x 1.7e9 params = 27 GB"); `lab.hardware.gpu_memory_gb` is read in the
same unit. Cards are usually sold and reported in GiB (a "32 GB" card holds ~34.4e9 bytes), so reading the card's
number as 1e9-byte GB leaves a ~7% margin on the safe side.

How verl 0.9.1 uses a GPU in one synchronous GRPO step (read from verl/workers/engine/fsdp/transformer_impl.py,
engine_workers.py, vllm_rollout/*), and what the plan assumes for each phase:

* Actor state, FSDP-sharded over the data-parallel GPUs (fsdp_size -1: all of them): parameters in fp32
  (fsdp_config.model_dtype: fp32) 4 B, gradients in fp32 4 B, AdamW's two moments in fp32 8 B: 16 B per trainable
  parameter, the guide's number. LoRA: the frozen base stays in fp32 (4 B/param, no gradient, no Adam), the adapters
  take 16 B/param. `actor_state_gb_per_gpu` is that sum divided by the FSDP size, minus what offload moves to RAM.
* Between phases verl frees the gradients (optimizer.zero_grad on leaving train mode) and moves offloaded state to
  RAM; for the update it loads everything back (EngineTrainModeCtx -> engine.to(cuda, optimizer=...)). So optimizer
  offload lowers the generation and weight-sync peaks, not the update peak; only LoRA or fewer tokens lower that.
* Generation: the actor's resident state + vLLM's budget `gpu_memory_utilization x card` (vLLM >= 0.7 measures it
  against the card's total memory; weights, activations, CUDA graphs and KV cache live inside it) + two CUDA contexts
  (trainer process and vLLM worker process: ~1.25 GB and ~0.9 GB, see below). SGLang (rollout.name: sglang) reads
  the same key as a fraction of the memory free when it starts, for weights + KV only, activations on top:
  grpo_lab/memory/engines.py.
* KV cache = budget - vLLM weights (bf16, / TP) - vLLM activation profile (max_num_batched_tokens tokens through one
  layer: ~8H + 6I bytes per token, plus sampler logits for max_num_seqs rows) - CUDA graph pool (~0.4 GB unless
  enforce_eager). KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x 2 (bf16), / TP.
  verl leaves rollout.max_model_len null -> the model's max_position_embeddings (40960 for Qwen3), and with
  enable_chunked_prefill=False raises max_num_batched_tokens to it; vLLM refuses to start unless one such sequence
  fits in the KV cache.
* Weight sync (checkpoint_engine `naive`, before each generation): vLLM's weights are woken (its KV cache is not yet),
  the actor's parameters are loaded (even with param_offload), gathered one tensor at a time in fp32 (the largest is
  the embedding, V x H x 4 B) and copied through one bucket of update_weights_bucket_megabytes MiB.
* Training (vLLM asleep: with free_cache_engine it sleeps at level 2, weights and KV freed; level 1 for LoRA adapters
  or layered_summon, weights to RAM; either way ~its CUDA context (+ graph pool) stays) is the largest of:
  - the update, at the larger of two moments: the start of the backward (params + Adam, no gradients yet, + FSDP
    gathers: the root unit, i.e. embeddings/lm_head, in bf16 with its bf16 gradient, and two decoder layers in bf16,
    + activations of one micro-batch of T tokens + the logits peak) and the end of the backward (the full 16 B state
    + the root unit's bf16 params, bf16 gradient and fp32 reduce-scatter copy). Small models with checkpointing peak
    at the start, the 1.7B and 4B at the end (measured on an H200, see benchmarks/gpu/memplan_README.md);
  - the optimizer step: full actor state + one fp32 temporary of the trainable shard (torch's foreach AdamW);
  - the old-log-prob forward (rollout.log_prob_max_token_len_per_gpu tokens, entropy computed for metrics) and the
    reference forward (ref.log_prob_max_token_len_per_gpu tokens; verl always CPU-offloads the FSDP reference's
    parameters and streams them in per layer), each with the actor's resident state beside it;
  - each with cuBLAS's workspaces, and beside it (outside torch's allocator, so not in verl's metric) the trainer's
    CUDA context and NCCL buffers (1.24 GB measured on the H200: verl's "device memory used" minus "memory
    reserved" after the first FSDP build) and what vLLM keeps while asleep (~0.9 GB, its context: "Sleep mode
    freed ..., X GiB still in use" minus the trainer's share).
* Activations per token (bf16 hidden states, RMSNorm inputs kept in fp32): one decoder layer saves about
  16 H + 8 I + 12 (heads + kv_heads) head_dim bytes for its backward (norm inputs, q/k/v/o and MLP inputs, the SwiGLU
  intermediates). With gradient checkpointing only each layer's input (2 H bytes) is kept for all layers, and one
  layer is recomputed at a time; with activation offload (FSDP, on top of checkpointing) the kept inputs go to RAM.
* Logits peak for T tokens and vocabulary V (verl runs the log-probs inside bf16 autocast, where log_softmax is
  fp32): bf16 logits + the fp32 log-softmax rows kept for the backward (the guide's "bf16 + fp32"), 6 B x T x V in
  the update. Entropy in the update (entropy_coeff != 0) adds a fp32 softmax, 4 B x T x V, unless chunked
  (entropy_from_logits_with_chunking: one chunk at a time). Forward-only passes keep the bf16 logits (2 B x T x V);
  their entropy is torch.compile'd by default (use_torch_compile) and fuses into reductions, eager it would add
  12 B x T x V.
* Host RAM: what offload moves (Adam 8 B, params 4 B per offloaded parameter), the reference model's fp32
  parameters (4 B x N, always on CPU), vLLM's weights for sleep level 1, and the processes themselves (~3 GB per
  trainer worker and per vLLM worker, ~6 GB for Ray, the TaskRunner and the data loaders), plus rank 0 loading the
  full fp32 model once at start-up.

* The trainer's torch allocator (what verl logs as actor/perf/max_memory_{allocated,reserved}_gb: the process's peak
  so far, never reset) also peaks at the weight sync, which the recorded runs showed (benchmarks/gpu/
  memplan_calibration.md): the bucket (update_weights_bucket_megabytes, 4 GiB in conf/config.yaml) is allocated on
  the card for the whole sync, beside the actor's parameters and Adam state; with FSDP1 (actor.strategy fsdp) on
  one GPU verl exports a FULL_STATE_DICT, and torch clones every parameter for it (fsdp/_state_dict_utils.py,
  _full_post_state_dict_hook), a tied embedding twice; elsewhere one full fp32 tensor at a time. Before the first
  step (the first sync) AdamW's moments do not exist yet, but with FSDP1 on one GPU (NO_SHARD) the reference's
  fp32 weights are still on the card: FSDP moves its flat parameters to the CPU (CPUOffload) but the module's
  parameter views keep the GPU copy alive until the reference's first forward re-points them (with sharding,
  FlatParamHandle.shard() frees that storage). cuBLAS and cuBLASLt take their workspaces from torch's allocator at
  the first matmul and keep them (64 MiB on the H200). `trainer_allocator` is the largest of these peaks.
  What torch reserves above the allocated peak (its cache, fragmentation) is not knowable before the run: on the
  recorded runs reserved was 1.00-1.24 x allocated (1.24: one step of Qwen3-1.7B's full fine-tuning; 1.15: the
  0.6B smoke under a 32 GB emulation), inside the 80% `tight` line; torch frees its cache and retries before it
  raises an out-of-memory error, so the allocated peak is the one that must fit.
* Units: the plan counts GB = 1e9 bytes; lab.hardware.gpu_memory_gb is the card's memory as CUDA and verl report it,
  in GiB (139.8 for an H200). vLLM's budget (SGLang's fraction) is taken of the card's real bytes, util x
  gpu_memory_gb x 2^30, as vLLM does (its "Available KV cache memory" follows it); peaks are compared with the
  card's number read as GB, which leaves ~7% of the card spare for what the plan cannot see.

Verdicts (grpo_lab/memory/calibration.py, per regime, from the recorded runs): `oom` when a GPU phase's peak is above the
card by more than the plan's measured error in that regime (UNMEASURED_MARGIN, 25%, where no run measured it; for
the generation phase the engine's budget is exact and only the rest carries the margin), `tight` above 80% of the
card or above it within that margin, else `fits`; host RAM (not calibrated) against the RAM as planned. plan.json's
`calibration` records, per verdict, the regime, whether it was measured and the margin used.

Where it lives: this module assembles plan.json's `memory` (`memory_plan`) and is where the rest of grpo-lab and the
benchmarks import the plan's names from; the model's shapes and the run's knobs are grpo_lab/memory/memplan_arch.py,
the bytes of each phase and the constants above grpo_lab/memory/memplan_phases.py, each phase's verdict with its margin
grpo_lab/memory/memplan_verdicts.py, and what would make a phase fit grpo_lab/memory/memplan_remedies.py.
"""

from __future__ import annotations

from typing import Any

from grpo_lab.memory.memplan_arch import LINEAR_NAMES, Arch, Settings, settings_from_verl
from grpo_lab.memory.memplan_phases import (
    CARD_UNIT_BYTES, CUBLAS_WORKSPACE_GB, ENTROPY_BYTES, ENTROPY_EAGER_BYTES, GB, HOST_BASE_GB, HOST_PER_GPU_WORKER_GB,
    HOST_PER_VLLM_WORKER_GB, LOGITS_FORWARD_BYTES, LOGITS_UPDATE_BYTES, MiB, TIGHT_FRACTION, TRAINER_CUDA_CONTEXT_GB,
    VLLM_CUDA_CONTEXT_GB, VLLM_CUDAGRAPH_GB, ActorState, activations, actor_state, actor_state_gb_per_gpu,
    attention_extra, card_bytes, engine_budget, fsdp_gathered, generation_phase, host_ram, kv_cache, logits_peak,
    optimizer_step_bytes, param_bytes, reference_on_card_at_start, resident_at_generation, resident_between_phases,
    round_gb, sync_copies, sync_trainer_side, trainer_allocator, training_phase, training_subphases, update_breakdown,
    update_peak_at, update_peaks, verdict_of, vllm_activation, vllm_batched_tokens, vllm_max_model_len, vllm_weights,
    weight_sync_phase)
from grpo_lab.memory.memplan_remedies import LORA_OVERRIDES, OFFLOAD_OVERRIDES, candidates, find_remedies
from grpo_lab.memory.memplan_verdicts import VERDICT_ORDER, calibration_of, generation_verdict, phase_result, worst

# the plan's names, for `from grpo_lab.memory import memplan` users (preflight rules, fit, benchmarks, tests)
__all__ = [
    "Arch", "Settings", "settings_from_verl", "LINEAR_NAMES",
    "GB", "MiB", "CARD_UNIT_BYTES", "CUBLAS_WORKSPACE_GB", "ENTROPY_BYTES", "ENTROPY_EAGER_BYTES", "HOST_BASE_GB",
    "HOST_PER_GPU_WORKER_GB", "HOST_PER_VLLM_WORKER_GB", "LOGITS_FORWARD_BYTES", "LOGITS_UPDATE_BYTES",
    "TIGHT_FRACTION", "TRAINER_CUDA_CONTEXT_GB", "VLLM_CUDA_CONTEXT_GB", "VLLM_CUDAGRAPH_GB",
    "ActorState", "activations", "actor_state", "actor_state_gb_per_gpu", "attention_extra", "card_bytes",
    "engine_budget", "fsdp_gathered", "generation_phase", "host_ram", "kv_cache", "logits_peak", "optimizer_step_bytes",
    "param_bytes", "reference_on_card_at_start", "resident_at_generation", "resident_between_phases", "round_gb",
    "sync_copies", "sync_trainer_side", "trainer_allocator", "training_phase", "training_subphases",
    "update_breakdown", "update_peak_at", "update_peaks", "verdict_of", "vllm_activation", "vllm_batched_tokens",
    "vllm_max_model_len", "vllm_weights", "weight_sync_phase",
    "VERDICT_ORDER", "calibration_of", "generation_verdict", "phase_result", "worst",
    "LORA_OVERRIDES", "OFFLOAD_OVERRIDES", "candidates", "find_remedies",
    "memory_plan",
]


def memory_plan(arch: Arch, s: Settings, *, remedies: bool = True) -> dict[str, Any]:
    """The `memory` section of plan.json."""
    card = s.card_gb
    cal = calibration_of(arch, s)
    gen = generation_phase(arch, s)
    kv = kv_cache(arch, s)
    gen["verdict"] = generation_verdict(arch, s, cal["generation"]["margin"])
    train = training_phase(arch, s)
    train["verdict"] = verdict_of(train["peak_gb_per_gpu"], card, cal["training"]["margin"])
    sync = weight_sync_phase(arch, s)
    sync["verdict"] = verdict_of(sync["peak_gb_per_gpu"], card, cal["weight_sync"]["margin"])
    host = host_ram(arch, s)
    overall = worst(gen["verdict"], train["verdict"], sync["verdict"], host["verdict"])
    n_lora = arch.lora_params(s.lora_rank, s.lora_targets)
    plan: dict[str, Any] = {
        "card_gb": card,
        "n_gpus": s.n_gpus,
        "fsdp_size": s.fsdp,
        "params": arch.params(),
        "params_b": round(arch.params() / 1e9, 3),
        "active_params": arch.active_params(),
        "moe": ({"num_experts": arch.num_experts, "num_experts_per_tok": arch.num_experts_per_tok,
                 "sparse_layers": arch.sparse_layers, "active_params_b": round(arch.active_params() / 1e9, 3)}
                if arch.is_moe else None),
        "trainable_params": n_lora if s.lora_rank > 0 else arch.params(),
        "architecture_source": arch.source,
        "actor_state_gb_per_gpu": round(actor_state_gb_per_gpu(arch, s), 2),
        "actor_state_full_gb_per_gpu": round_gb(actor_state(arch, s).total),
        "phases": {"generation": gen, "training": train, "weight_sync": sync},
        "trainer_allocator": trainer_allocator(arch, s),
        "kv_cache": kv,
        "host_ram_gb": host["total_gb"],
        "host_ram": host,
        "verdict": {"generation": gen["verdict"], "training": train["verdict"], "weight_sync": sync["verdict"],
                    "host_ram": host["verdict"], "overall": overall},
        "calibration": cal,
    }
    if remedies:
        plan["remedies"] = {ph: find_remedies(arch, s, ph)
                            for ph in ("generation", "training", "weight_sync", "host_ram")
                            if plan["verdict"][ph] in ("tight", "oom")}
    return plan
