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
  recorded runs reserved was 1.00-1.11 x allocated, inside the 80% `tight` line; torch frees its cache and retries
  before it raises an out-of-memory error, so the allocated peak is the one that must fit.
* Units: the plan counts GB = 1e9 bytes; lab.hardware.gpu_memory_gb is the card's memory as CUDA and verl report it,
  in GiB (139.8 for an H200). vLLM's budget (SGLang's fraction) is taken of the card's real bytes, util x
  gpu_memory_gb x 2^30, as vLLM does (its "Available KV cache memory" follows it); peaks are compared with the
  card's number read as GB, which leaves ~7% of the card spare for what the plan cannot see.

Verdicts (grpo_lab/memory/calibration.py, per regime, from the recorded runs): `oom` when a GPU phase's peak is above the
card by more than the plan's measured error in that regime (UNMEASURED_MARGIN, 25%, where no run measured it; for
the generation phase the engine's budget is exact and only the rest carries the margin), `tight` above 80% of the
card or above it within that margin, else `fits`; host RAM (not calibrated) against the RAM as planned. plan.json's
`calibration` records, per verdict, the regime, whether it was measured and the margin used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from grpo_lab.memory import engines
from grpo_lab.cli.config import get as _get

GB = 1e9
MiB = 1 << 20

# ---- documented constants (see the module docstring) ----
# measured on the H200 (benchmarks/gpu/memplan_calibration.md): 1.235 GB outside torch's allocator after the first FSDP
# build (CUDA context 0.51 GiB + NCCL 0.64 GiB); less on cards with smaller contexts, so an upper bound
TRAINER_CUDA_CONTEXT_GB = 1.25   # the FSDP worker's CUDA context + NCCL buffers (outside torch's allocator)
# the vLLM worker's memory outside its util budget, what its level-2 sleep leaves: 0.82-0.85 GiB on the H200 (eager)
VLLM_CUDA_CONTEXT_GB = 0.9
# cuBLAS's workspaces, taken from torch's allocator at the first matmul and kept for the process: 64 MiB on the H200
# (smoke_tiny's allocated peak grew by 0.0625 GiB after its first step; memplan_bench's resident rows sit 66 MB above
# the plan's state); torch's default workspace is smaller before Hopper, so an upper bound there
CUBLAS_WORKSPACE_GB = 64 * (1 << 20) / 1e9
# bytes in one unit of lab.hardware.gpu_memory_gb: the card's memory as CUDA reports it, in GiB (139.8 on an H200)
CARD_UNIT_BYTES = 1 << 30
VLLM_CUDAGRAPH_GB = 0.4          # CUDA graph pool when enforce_eager is false
TIGHT_FRACTION = 0.80            # above this share of the card (or RAM): tight
LOGITS_UPDATE_BYTES = 6.0        # per token x vocab in the update: bf16 logits + fp32 log-softmax path
LOGITS_FORWARD_BYTES = 2.0       # per token x vocab in a forward-only pass: the bf16 logits
ENTROPY_BYTES = 4.0              # per token x vocab: the fp32 softmax an entropy in the loss saves for backward
ENTROPY_EAGER_BYTES = 12.0       # per token x vocab: eager entropy under autocast (fp32 softmax, product, logsumexp)
HOST_PER_GPU_WORKER_GB = 3.0     # RSS of one FSDP worker process (torch, CUDA libraries, model code)
HOST_PER_VLLM_WORKER_GB = 3.0    # RSS of one vLLM worker process
HOST_BASE_GB = 6.0               # Ray, TaskRunner, reward workers, data loaders

# verl's LoRA example (and conf/model/qwen3_8b_lora.yaml), as overrides: rank 64 on all linear layers, safetensors
# loading for vLLM; for models above 6B also the frozen base and the adapters' Adam state to RAM
LORA_OVERRIDES = ("actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=32 "
                  "actor_rollout_ref.rollout.load_format=safetensors")
OFFLOAD_OVERRIDES = ("actor_rollout_ref.actor.fsdp_config.param_offload=true "
                     "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true")

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Arch:
    """The architecture facts the plan needs (Qwen3 / Llama-style decoder with SwiGLU MLP and q/k norms).

    Mixture of experts (Qwen3-MoE's config.json: num_experts, num_experts_per_tok, moe_intermediate_size,
    decoder_sparse_step, mlp_only_layers): a sparse layer holds num_experts SwiGLU experts and a router; every expert
    is a parameter, so weights, gradients, Adam state and vLLM's weights count them all (`params()`), while a token
    passes through num_experts_per_tok of them, so activations use the active width (`active_intermediate`).
    """

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int | None = None
    qk_norm: bool = True
    source: str = ""
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    sparse_layers: int = 0  # decoder layers with experts (the others have the dense MLP)

    FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], source: str = "") -> "Arch":
        """From a config.json-like mapping; head_dim defaults to hidden/heads, kv heads to heads (as HF does)."""
        heads = int(d["num_attention_heads"])
        head_dim = d.get("head_dim") or int(d["hidden_size"]) // heads
        kv = d.get("num_key_value_heads") or heads
        layers = int(d["num_hidden_layers"])
        experts = int(d.get("num_experts") or d.get("num_local_experts") or 0)
        sparse = 0
        if experts > 0:
            step = int(d.get("decoder_sparse_step") or 1)
            dense_only = set(d.get("mlp_only_layers") or ())
            sparse = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        moe_i = int(d.get("moe_intermediate_size") or 0) if experts else 0
        return cls(
            num_hidden_layers=layers, hidden_size=int(d["hidden_size"]),
            num_attention_heads=heads, num_key_value_heads=int(kv), head_dim=int(head_dim),
            intermediate_size=int(d.get("intermediate_size") or moe_i), vocab_size=int(d["vocab_size"]),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=(int(d["max_position_embeddings"]) if d.get("max_position_embeddings") else None),
            qk_norm=str(d.get("model_type", "qwen3")).startswith("qwen3"), source=source,
            num_experts=experts, num_experts_per_tok=int(d.get("num_experts_per_tok") or 0) if experts else 0,
            moe_intermediate_size=moe_i, sparse_layers=sparse)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.sparse_layers > 0

    # ---- parameter counts ----
    def linear_shapes(self, intermediate: int | None = None) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder layer (of one expert's MLP for a sparse layer)."""
        h, i = self.hidden_size, self.intermediate_size if intermediate is None else intermediate
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def _attention_params(self) -> int:
        shapes = self.linear_shapes()
        return sum(a * b for k, (a, b) in shapes.items() if k.endswith(("q_proj", "k_proj", "v_proj", "o_proj")))

    def _norm_params(self) -> int:
        return 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)

    def _dense_layer_params(self) -> int:
        return sum(a * b for a, b in self.linear_shapes().values()) + self._norm_params()

    def _sparse_layer_params(self, experts: int) -> int:
        expert = 3 * self.hidden_size * self.moe_intermediate_size
        router = self.hidden_size * self.num_experts
        return self._attention_params() + experts * expert + router + self._norm_params()

    def layer_params(self) -> int:
        """Parameters of the largest decoder layer (what FSDP gathers at once for one layer)."""
        if self.is_moe:
            return self._sparse_layer_params(self.num_experts)
        return self._dense_layer_params()

    def root_params(self) -> int:
        """Parameters outside the decoder layers: embeddings, lm_head (unless tied), final norm (FSDP's root unit)."""
        emb = self.vocab_size * self.hidden_size
        return emb * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    def params(self) -> int:
        """All parameters (every expert of an MoE): what weights, gradients, optimizer and vLLM hold."""
        if self.is_moe:
            dense = self.num_hidden_layers - self.sparse_layers
            return (dense * self._dense_layer_params() + self.sparse_layers * self._sparse_layer_params(
                self.num_experts) + self.root_params())
        return self.num_hidden_layers * self.layer_params() + self.root_params()

    def active_params(self) -> int:
        """Parameters one token passes through (num_experts_per_tok experts of each sparse layer)."""
        if not self.is_moe:
            return self.params()
        dense = self.num_hidden_layers - self.sparse_layers
        return (dense * self._dense_layer_params() + self.sparse_layers * self._sparse_layer_params(
            self.num_experts_per_tok) + self.root_params())

    @property
    def active_intermediate(self) -> int:
        """The MLP width one token's activations see: num_experts_per_tok x moe_intermediate_size in a sparse layer."""
        if self.is_moe:
            return max(self.intermediate_size if self.sparse_layers < self.num_hidden_layers else 0,
                       self.num_experts_per_tok * self.moe_intermediate_size)
        return self.intermediate_size

    def lora_params(self, rank: int, target_modules: Any = "all-linear") -> int:
        """Adapter parameters: rank x (in + out) per targeted linear layer (PEFT's A and B matrices; every expert's)."""
        if rank <= 0:
            return 0
        shapes = self.linear_shapes(self.moe_intermediate_size if self.is_moe else None)
        if target_modules in (None, "all-linear", "all_linear"):
            names = list(shapes)
        else:
            wanted = [target_modules] if isinstance(target_modules, str) else list(target_modules)
            names = [n for n in shapes if any(w == n or n.endswith(str(w)) for w in wanted)]
        per_expert = self.num_experts if self.is_moe else 1
        return self.num_hidden_layers * sum(
            rank * (shapes[n][0] + shapes[n][1]) * (per_expert if n in ("gate_proj", "up_proj", "down_proj") else 1)
            for n in names)

    # ---- per-token sizes ----
    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of every layer for one token: 2 x layers x kv_heads x head_dim x dtype."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    def layer_activation_bytes_per_token(self) -> int:
        """What one decoder layer saves for its backward per token (bf16 tensors, fp32 RMSNorm inputs)."""
        h, i = self.hidden_size, self.active_intermediate
        heads = (self.num_attention_heads + self.num_key_value_heads) * self.head_dim
        return 16 * h + 8 * i + 12 * heads

    def layer_forward_bytes_per_token(self) -> int:
        """Transient of one layer's forward without autograd (hidden, qkv, MLP gate/up and product)."""
        h, i = self.hidden_size, self.active_intermediate
        qkv = (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim
        return 2 * (4 * h + qkv + 3 * i)


@dataclass(frozen=True)
class Settings:
    """The knobs of a run that move memory (extracted from a verl config by `settings_from_verl`)."""

    n_gpus: int
    card_gb: float
    host_ram_gb: float | None = None  # per node
    nnodes: int = 1
    fsdp_size: int = -1
    sp_size: int = 1
    strategy: str = "fsdp"  # actor.strategy: fsdp (FSDP1, verl's default) or fsdp2
    ref_model_dtype: str = "fp32"  # ref.fsdp_config.model_dtype (null: bf16, verl's forward-only default)
    # actor
    lora_rank: int = 0
    lora_targets: Any = "all-linear"
    param_offload: bool = False
    optimizer_offload: bool = False
    model_dtype: str = "fp32"
    gradient_checkpointing: bool = True
    activation_offload: bool = False
    attn_implementation: str = "flash_attention_2"
    use_dynamic_bsz: bool = True
    ppo_max_token_len_per_gpu: int = 16384
    ppo_micro_batch_size_per_gpu: int | None = None
    entropy_in_update: bool = False
    entropy_checkpointing: bool = False
    actor_entropy_chunking: bool = False
    entropy_chunk_size: int = 2048
    use_torch_compile: bool = True
    # lengths
    max_prompt_length: int = 512
    max_response_length: int = 512
    # log-prob passes
    log_prob_use_dynamic_bsz: bool = True
    log_prob_max_token_len_per_gpu: int = 16384
    log_prob_micro_batch_size_per_gpu: int | None = None
    ref_used: bool = True
    ref_log_prob_use_dynamic_bsz: bool = True
    ref_log_prob_max_token_len_per_gpu: int = 16384
    ref_log_prob_micro_batch_size_per_gpu: int | None = None
    ref_entropy_chunking: bool = False
    # rollout
    rollout_engine: str = "vllm"  # rollout.name: vllm or sglang (grpo_lab/memory/engines.py: what util means to each)
    gpu_memory_utilization: float = 0.5
    tp: int = 1
    rollout_dp: int = 1
    free_cache_engine: bool = True
    enforce_eager: bool = False
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None
    layered_summon: bool = False
    # engine_kwargs.vllm.kv_cache_memory_bytes: vLLM sets its KV cache to this instead of sizing it from util x card
    vllm_kv_cache_bytes: int | None = None
    bucket_mb: int = 2048
    # batch
    train_batch_size: int = 128
    rollout_n: int = 1

    @property
    def seq_len(self) -> int:
        return self.max_prompt_length + self.max_response_length

    @property
    def fsdp(self) -> int:
        """GPUs one actor shard is split over."""
        dp = self.n_gpus
        return dp if self.fsdp_size is None or self.fsdp_size <= 0 or self.fsdp_size >= dp else self.fsdp_size

    @property
    def update_tokens(self) -> int:
        """Tokens in one update micro-batch on one GPU."""
        if self.use_dynamic_bsz:
            return int(self.ppo_max_token_len_per_gpu)
        return int(self.ppo_micro_batch_size_per_gpu or 1) * self.seq_len

    @property
    def log_prob_tokens(self) -> int:
        if self.log_prob_use_dynamic_bsz:
            return int(self.log_prob_max_token_len_per_gpu)
        return int(self.log_prob_micro_batch_size_per_gpu or 1) * self.seq_len

    @property
    def ref_log_prob_tokens(self) -> int:
        if self.ref_log_prob_use_dynamic_bsz:
            return int(self.ref_log_prob_max_token_len_per_gpu)
        return int(self.ref_log_prob_micro_batch_size_per_gpu or 1) * self.seq_len

    @property
    def vllm_sleep_level(self) -> int:
        # verl: level 1 for LoRA adapters (not merged) and layered_summon, else level 2 (vLLM >= 0.18)
        return 1 if (self.lora_rank > 0 or self.layered_summon) else 2


def settings_from_verl(verl: Mapping[str, Any], lab: Mapping[str, Any]) -> Settings:
    """The memory-relevant settings of a resolved verl config (plain dict) and grpo-lab's `lab` dict."""
    a = "actor_rollout_ref."
    n_gpus = int(_get(verl, "trainer.n_gpus_per_node", 1)) * int(_get(verl, "trainer.nnodes", 1))
    override = _get(verl, a + "model.override_config", {}) or {}
    entropy_coeff = _get(verl, a + "actor.entropy_coeff", 0) or 0
    use_kl = bool(_get(verl, a + "actor.use_kl_loss", False)) or bool(_get(verl, "algorithm.use_kl_in_reward", False))
    max_model_len = _get(verl, a + "rollout.max_model_len")
    return Settings(
        n_gpus=max(1, n_gpus),
        card_gb=float(_get(lab, "hardware.gpu_memory_gb", 0) or 0),
        host_ram_gb=_get(lab, "hardware.host_ram_gb"),
        fsdp_size=int(_get(verl, a + "actor.fsdp_config.fsdp_size", -1)),
        nnodes=max(1, int(_get(verl, "trainer.nnodes", 1) or 1)),
        strategy=str(_get(verl, a + "actor.strategy", "fsdp") or "fsdp"),
        ref_model_dtype=str(_get(verl, a + "ref.fsdp_config.model_dtype", "fp32") or "bf16"),
        # verl 0.9.1: fsdp_config.ulysses_sequence_parallel_size; the deprecated actor key wins when above 1
        sp_size=max(int(_get(verl, a + "actor.ulysses_sequence_parallel_size", 1) or 1),
                    int(_get(verl, a + "actor.fsdp_config.ulysses_sequence_parallel_size", 1) or 1)),
        lora_rank=int(_get(verl, a + "model.lora_rank", 0) or 0),
        lora_targets=_get(verl, a + "model.target_modules", "all-linear"),
        param_offload=bool(_get(verl, a + "actor.fsdp_config.param_offload", False)),
        optimizer_offload=bool(_get(verl, a + "actor.fsdp_config.optimizer_offload", False)),
        model_dtype=str(_get(verl, a + "actor.fsdp_config.model_dtype", "fp32") or "fp32"),
        gradient_checkpointing=bool(_get(verl, a + "model.enable_gradient_checkpointing", True)),
        activation_offload=bool(_get(verl, a + "model.enable_activation_offload", False)),
        attn_implementation=str(override.get("attn_implementation", "flash_attention_2")),
        use_dynamic_bsz=bool(_get(verl, a + "actor.use_dynamic_bsz", False)),
        ppo_max_token_len_per_gpu=int(_get(verl, a + "actor.ppo_max_token_len_per_gpu", 16384)),
        ppo_micro_batch_size_per_gpu=_get(verl, a + "actor.ppo_micro_batch_size_per_gpu"),
        entropy_in_update=bool(_get(verl, a + "actor.calculate_entropy", False)) or float(entropy_coeff) != 0.0,
        entropy_checkpointing=bool(_get(verl, a + "actor.entropy_checkpointing", False)),
        actor_entropy_chunking=bool(_get(verl, a + "actor.entropy_from_logits_with_chunking", False)),
        entropy_chunk_size=int(_get(verl, a + "actor.entropy_from_logits_chunk_size", 2048)),
        use_torch_compile=bool(_get(verl, a + "actor.use_torch_compile", True))
        and bool(_get(verl, a + "actor.fsdp_config.use_torch_compile", True)),
        max_prompt_length=int(_get(verl, "data.max_prompt_length", 512)),
        max_response_length=int(_get(verl, "data.max_response_length", 512)),
        log_prob_use_dynamic_bsz=bool(_get(verl, a + "rollout.log_prob_use_dynamic_bsz", False)),
        log_prob_max_token_len_per_gpu=int(_get(verl, a + "rollout.log_prob_max_token_len_per_gpu", 16384)),
        log_prob_micro_batch_size_per_gpu=_get(verl, a + "rollout.log_prob_micro_batch_size_per_gpu"),
        ref_used=use_kl,
        ref_log_prob_use_dynamic_bsz=bool(_get(verl, a + "ref.log_prob_use_dynamic_bsz", False)),
        ref_log_prob_max_token_len_per_gpu=int(_get(verl, a + "ref.log_prob_max_token_len_per_gpu", 16384)),
        ref_log_prob_micro_batch_size_per_gpu=_get(verl, a + "ref.log_prob_micro_batch_size_per_gpu"),
        ref_entropy_chunking=bool(_get(verl, a + "ref.entropy_from_logits_with_chunking", False)),
        rollout_engine=str(_get(verl, a + "rollout.name", "vllm")),
        gpu_memory_utilization=float(_get(verl, a + "rollout.gpu_memory_utilization", 0.5)),
        tp=int(_get(verl, a + "rollout.tensor_model_parallel_size", 1) or 1),
        rollout_dp=int(_get(verl, a + "rollout.data_parallel_size", 1) or 1),
        free_cache_engine=bool(_get(verl, a + "rollout.free_cache_engine", True)),
        enforce_eager=bool(_get(verl, a + "rollout.enforce_eager", False)),
        max_num_seqs=int(_get(verl, a + "rollout.max_num_seqs", 256)),
        max_num_batched_tokens=int(_get(verl, a + "rollout.max_num_batched_tokens", 8192)),
        enable_chunked_prefill=bool(_get(verl, a + "rollout.enable_chunked_prefill", True)),
        max_model_len=int(max_model_len) if max_model_len else None,
        layered_summon=bool(_get(verl, a + "rollout.layered_summon", False)),
        vllm_kv_cache_bytes=_positive_int(_get(verl, a + "rollout.engine_kwargs.vllm.kv_cache_memory_bytes")),
        bucket_mb=int(_get(verl, a + "rollout.checkpoint_engine.update_weights_bucket_megabytes", 2048)),
        train_batch_size=int(_get(verl, "data.train_batch_size", 128)),
        rollout_n=int(_get(verl, a + "rollout.n", 1)),
    )


# ---------------------------------------------------------------------------------------------------------------
# components (bytes)
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class ActorState:
    params: float       # fp32 parameters (base + adapters), sharded
    grads: float        # fp32 gradients of the trainable parameters, sharded
    optimizer: float    # AdamW moments, fp32, sharded
    trainable: int      # trainable parameter count (whole model)

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def param_bytes(s: Settings) -> float:
    """Bytes per actor parameter as FSDP keeps it: fp32 by default (fsdp_config.model_dtype), 2 for bf16/fp16."""
    return 4.0 if str(s.model_dtype).lower() in ("fp32", "float32", "float") else 2.0


def actor_state(arch: Arch, s: Settings) -> ActorState:
    """Per-GPU actor state with everything on the card (what the update needs).

    Gradients and AdamW's two moments take the parameters' dtype (fp32: 4 + 4 + 8 = 16 B per trainable parameter).
    """
    n_lora = arch.lora_params(s.lora_rank, s.lora_targets)
    trainable = n_lora if s.lora_rank > 0 else arch.params()
    f = s.fsdp
    pb = param_bytes(s)
    return ActorState(params=pb * (arch.params() + n_lora) / f, grads=pb * trainable / f,
                      optimizer=2 * pb * trainable / f, trainable=trainable)


def actor_state_gb_per_gpu(arch: Arch, s: Settings) -> float:
    """The guide's accounting: 16 B per trainable parameter (4 B per frozen one) / FSDP size, minus offloaded parts."""
    st = actor_state(arch, s)
    total = st.total
    if s.param_offload:
        total -= st.params + st.grads
    if s.optimizer_offload:
        total -= st.optimizer
    return total / GB


def resident_between_phases(arch: Arch, s: Settings) -> float:
    """Actor bytes that stay on a GPU while vLLM runs: params unless offloaded, Adam unless offloaded (grads freed)."""
    st = actor_state(arch, s)
    return (0.0 if s.param_offload else st.params) + (0.0 if s.optimizer_offload else st.optimizer)


def activations(arch: Arch, s: Settings, tokens: int) -> float:
    """Saved activations of one micro-batch of `tokens` tokens in the update (bytes)."""
    per_layer = arch.layer_activation_bytes_per_token()
    L = arch.num_hidden_layers
    if s.gradient_checkpointing:
        kept_layers = 2 if s.activation_offload else L
        act = tokens * kept_layers * arch.hidden_size * 2 + tokens * per_layer
    else:
        act = tokens * L * per_layer
    return act + attention_extra(arch, s, tokens, training=True)


def attention_extra(arch: Arch, s: Settings, tokens: int, training: bool) -> float:
    """Packed sequences without flash-attn: sdpa takes a dense T x T mask; eager also materialises the scores."""
    impl = s.attn_implementation
    if impl.startswith("flash"):
        return 0.0
    extra = tokens * tokens * 1.0  # boolean block-causal mask, shared by the layers
    if impl == "eager":
        layers = arch.num_hidden_layers if (training and not s.gradient_checkpointing) else 1
        extra += layers * tokens * tokens * arch.num_attention_heads * (2 + 4)
    return extra


def logits_peak(arch: Arch, tokens: int, *, update: bool, entropy: bool, chunked: bool, chunk: int,
                checkpointed: bool = False, compiled: bool = True) -> float:
    """The vocabulary-sized tensors of one micro-batch (bytes).

    verl computes log-probs and entropy inside the bf16 autocast region: log_softmax and softmax run in fp32 there.
    The update keeps the bf16 logits and each row's fp32 log-softmax for the backward (6 B x T x V). A forward-only
    pass keeps the bf16 logits (2 B) while the entropy runs: torch.compile'd (verl's default, use_torch_compile) it
    fuses into reductions and adds ~nothing; eager it materialises fp32 softmax, product and logsumexp input
    (12 B); chunked, one chunk of those at a time.
    """
    v = arch.vocab_size
    base = tokens * v * (LOGITS_UPDATE_BYTES if update else LOGITS_FORWARD_BYTES)
    if not entropy:
        return base
    eager = ENTROPY_EAGER_BYTES
    if chunked:
        return base + min(chunk, tokens) * v * eager
    if update:
        # the entropy joins the loss: its fp32 softmax is saved for the backward unless recomputed
        return base + tokens * v * (2.0 if checkpointed else ENTROPY_BYTES)
    return base + (0.0 if compiled else tokens * v * eager)


def fsdp_gathered(arch: Arch, s: Settings, *, backward: bool) -> float:
    """Unsharded bf16 copies FSDP holds at once: the root unit (+ its bf16 gradient in backward) and two layers.

    The root unit (embeddings, lm_head, final norm) stays unsharded from the forward to the end of the backward; the
    lm_head's gradient is the first one the backward makes, into the root's unsharded bf16 gradient.
    """
    root = arch.root_params()
    root_grad = 2.0 * root if (backward and s.lora_rank == 0) else 0.0
    return 2.0 * root + root_grad + 2 * 2.0 * arch.layer_params()


def update_peaks(arch: Arch, s: Settings) -> dict[str, dict[str, float]]:
    """The two candidate peaks of the update (bytes torch's allocator holds; no CUDA context, no vLLM).

    backward_start: the activations and logits of one micro-batch are all alive, but FSDP has not yet made the
      sharded gradients (they appear layer by layer as the backward frees activations): params + Adam only.
    backward_end: every sharded gradient exists; the root unit's gradient is reduced last, its unsharded bf16
      gradient and the fp32 copy for the reduce-scatter beside its bf16 parameters.
    (Measured on an H200 with FSDP2 for Qwen3 0.6B-4B, gradient checkpointing on and off: within 2%.)
    """
    t = s.update_tokens
    st = actor_state(arch, s)
    root = arch.root_params()
    start = {
        "actor_params_and_optimizer": st.params + st.optimizer,
        "fsdp_gathered": fsdp_gathered(arch, s, backward=True),
        "activations": activations(arch, s, t),
        "logits": logits_peak(arch, t, update=True, entropy=s.entropy_in_update, chunked=s.actor_entropy_chunking,
                              chunk=s.entropy_chunk_size, checkpointed=s.entropy_checkpointing,
                              compiled=s.use_torch_compile),
    }
    end = {
        "actor_state": st.total,
        "fsdp_gathered": 2.0 * root + 2.0 * arch.layer_params(),
        "root_grad_reduce": (2.0 + 4.0) * root if s.lora_rank == 0 else 0.0,
    }
    return {"backward_start": start, "backward_end": end}


def vllm_weights(arch: Arch, s: Settings) -> float:
    return 2.0 * arch.params() / s.tp


def vllm_max_model_len(arch: Arch, s: Settings) -> int:
    if s.max_model_len:
        return int(s.max_model_len)
    return int(arch.max_position_embeddings or s.seq_len)


def vllm_batched_tokens(arch: Arch, s: Settings) -> int:
    mml = vllm_max_model_len(arch, s)
    if not s.enable_chunked_prefill:
        return max(s.max_num_batched_tokens, mml)
    return s.max_num_batched_tokens


def vllm_activation(arch: Arch, s: Settings) -> float:
    """vLLM's profiled activation peak: one layer over max_num_batched_tokens tokens + sampler logits."""
    t = vllm_batched_tokens(arch, s)
    h, i = arch.hidden_size, arch.active_intermediate
    return t * (8 * h + 6 * i) / s.tp + s.max_num_seqs * arch.vocab_size * 4 * 3


# ---------------------------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------------------------

def verdict_of(peak_gb: float, capacity_gb: float, margin: float = 0.0, exact_gb: float = 0.0) -> str:
    """`oom` when even the plan's largest measured overshoot (`margin`, grpo_lab/memory/calibration.py) leaves the peak
    above the capacity (`exact_gb`: the part of the peak that is known exactly and carries no margin); `tight`
    above TIGHT_FRACTION of it or above it within the margin; else `fits`."""
    if capacity_gb <= 0:
        return "unknown"
    if exact_gb + (peak_gb - exact_gb) / (1.0 + margin) > capacity_gb:
        return "oom"
    if peak_gb > TIGHT_FRACTION * capacity_gb:
        return "tight"
    return "fits"


def calibration_of(arch: Arch, s: Settings) -> dict[str, Any]:
    """plan.json's `calibration`: per verdict, the regime, whether a recorded run measured it, the margin used."""
    from grpo_lab.memory import calibration  # reads the calibration table once (benchmarks/gpu/memplan_calibration.json)

    regime = calibration.regime_of(arch, s)
    out: dict[str, Any] = {ph: calibration.phase_calibration(regime, ph)
                           for ph in ("generation", "training", "weight_sync", "kv_cache")}
    out["host_ram"] = {"regime": regime, "measured": False, "margin": 0.0, "basis": "host_ram",
                       "note": "host RAM is not calibrated: compared with the RAM as planned (the kernel's OOM killer "
                               "ends a run without a Python error)"}
    out["table"] = calibration.TABLE_MD
    return out


def _exact_gb(arch: Arch, s: Settings, phase: str) -> float:
    """The part of a phase's peak known exactly: the engine's static budget in the generation phase (vLLM takes
    util x card, SGLang its fraction of the memory free at its start, whatever else the plan gets wrong)."""
    return engine_budget(arch, s)[0] / GB if phase == "generation" else 0.0


_ORDER = {"fits": 0, "unknown": 0, "tight": 1, "oom": 2}


def worst(*verdicts: str) -> str:
    return max(verdicts, key=lambda v: _ORDER.get(v, 0)) if verdicts else "fits"


def _positive_int(v: Any) -> int | None:
    try:
        n = int(float(v))
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def _gb(x: float) -> float:
    return round(x / GB, 2)


# ---- rollout engine hook (grpo_lab/memory/engines.py): vLLM's budget is util x card and holds its activations; SGLang's
# is util x the memory free when it starts (after the actor's parameters), for weights + KV, activations on top ----
def engine_budget(arch: Arch, s: Settings) -> tuple[float, float, str]:
    """(static budget bytes, bytes the engine adds on top of it while generating, one-sentence rule) per GPU."""
    if s.vllm_kv_cache_bytes and s.rollout_engine == "vllm":
        # a pinned cache: vLLM's own memory is its weights, activations and CUDA graphs plus exactly this
        graphs = 0.0 if s.enforce_eager else VLLM_CUDAGRAPH_GB * GB
        rest = vllm_weights(arch, s) + vllm_activation(arch, s) + graphs
        budget = rest + s.vllm_kv_cache_bytes
        return budget, 0.0, (f"vLLM: engine_kwargs.vllm.kv_cache_memory_bytes pins its KV cache at "
                             f"{s.vllm_kv_cache_bytes / GB:.2f} GB (gpu_memory_utilization does not size it): with its "
                             f"weights, activations and CUDA graphs ({rest / GB:.2f} GB) {budget / GB:.2f} GB")
    at_start = ((0.0 if s.param_offload else actor_state(arch, s).params) / GB
                + reference_on_card_at_start(arch, s) / GB + TRAINER_CUDA_CONTEXT_GB + VLLM_CUDA_CONTEXT_GB)
    e, u = s.rollout_engine, s.gpu_memory_utilization
    extra = 0.0 if engines.budget_holds_activations(e) else (
        vllm_activation(arch, replace(s, enable_chunked_prefill=True))  # SGLang chunks its prefill by default
        + (0.0 if s.enforce_eager else VLLM_CUDAGRAPH_GB * GB))
    card = card_bytes(s) / GB  # the engines take their fraction of the card's real bytes
    return engines.static_budget_gb(e, u, card, at_start) * GB, extra, engines.explain(e, u, card, at_start)


def card_bytes(s: Settings) -> float:
    """The card's real bytes, what vLLM's util and SGLang's fraction apply to: gpu_memory_gb x 2^30 (GiB, as CUDA
    reports it; 139.8 on an H200 = 150.1e9 bytes). Verdicts read the same number as GB, ~7% below it."""
    return s.card_gb * CARD_UNIT_BYTES


def kv_cache(arch: Arch, s: Settings) -> dict[str, Any]:
    budget, on_top, rule = engine_budget(arch, s)  # engine hook
    graphs = 0.0 if s.enforce_eager else VLLM_CUDAGRAPH_GB * GB
    weights = vllm_weights(arch, s)
    act = vllm_activation(arch, s)
    kv_bytes_gpu = budget - weights - (0.0 if on_top else act + graphs)  # engine hook: SGLang's are outside
    per_token_gpu = arch.kv_bytes_per_token() / s.tp
    tokens = int(kv_bytes_gpu // per_token_gpu) if kv_bytes_gpu > 0 else 0
    seq = s.seq_len
    sequences = tokens // seq if seq else 0
    replica_gpus = s.tp * max(1, s.rollout_dp)
    replicas = max(1, s.n_gpus // replica_gpus)
    trajectories = s.train_batch_size * s.rollout_n
    per_replica = math.ceil(trajectories / replicas)
    concurrent = min(sequences, s.max_num_seqs)
    waves = math.ceil(per_replica / concurrent) if concurrent > 0 else None
    return {
        "engine": s.rollout_engine,  # engine hook
        "budget_rule": rule,  # engine hook
        "budget_gb": _gb(budget),
        "vllm_weights_gb": _gb(weights),
        "vllm_activation_gb": _gb(act),
        "cudagraph_gb": _gb(graphs),
        "kv_cache_gb": _gb(max(0.0, kv_bytes_gpu)),
        "kv_cache_memory_bytes": s.vllm_kv_cache_bytes,  # the pin (engine_kwargs.vllm), None when vLLM measures
        "bytes_per_token": per_token_gpu,
        "tokens": tokens,
        "sequence_length": seq,
        "sequences": sequences,
        "max_model_len": vllm_max_model_len(arch, s),
        "max_num_batched_tokens": vllm_batched_tokens(arch, s),
        # engine hook: vLLM refuses to start below one max_model_len sequence; SGLang needs one GRPO sequence
        "fits_max_model_len": tokens >= (vllm_max_model_len(arch, s) if not on_top else seq),
        "replicas": replicas,
        "trajectories_per_replica": per_replica,
        "concurrent_sequences": concurrent,
        "waves": waves,
    }


def resident_at_generation(arch: Arch, s: Settings) -> float:
    """The actor's bytes on a card while vLLM generates: between steps (resident_between_phases), or before the
    first step, when AdamW's moments do not exist yet but the reference may still be on the card."""
    start = (0.0 if s.param_offload else actor_state(arch, s).params) + reference_on_card_at_start(arch, s)
    return max(resident_between_phases(arch, s), start)


def generation_phase(arch: Arch, s: Settings) -> dict[str, Any]:
    resident = resident_at_generation(arch, s)
    vllm, on_top, _ = engine_budget(arch, s)  # engine hook
    ctx = (TRAINER_CUDA_CONTEXT_GB + VLLM_CUDA_CONTEXT_GB) * GB
    peak = resident + vllm + on_top + ctx
    engine = {"vllm_budget": _gb(vllm)} if not on_top else {"sglang_static": _gb(vllm), "sglang_activations": _gb(on_top)}
    return {"peak_gb_per_gpu": _gb(peak),
            "components_gb": {"actor_resident": _gb(resident), **engine, "cuda_contexts": _gb(ctx)}}


def sync_copies(arch: Arch, s: Settings) -> float:
    """Bytes of the weights the trainer materialises to send them to the rollout (beside the bucket).

    FSDP1 on one GPU: verl exports a FULL_STATE_DICT (engine/fsdp/transformer_impl.py sets it for a world of one),
    and torch clones every parameter for it, in the parameters' dtype, a tied embedding once per name. Elsewhere the
    parameters are gathered one full tensor at a time (the largest: the embedding in fp32); LoRA sends the adapters
    (or, with layered_summon, one layer at a time).
    """
    emb = arch.vocab_size * arch.hidden_size
    if s.lora_rank > 0:
        return 4.0 * arch.layer_params() if s.layered_summon else 4.0 * emb
    if s.strategy == "fsdp" and s.n_gpus == 1:
        return param_bytes(s) * (arch.params() + (emb if arch.tie_word_embeddings else 0))
    return 4.0 * emb


def reference_on_card_at_start(arch: Arch, s: Settings) -> float:
    """The reference's weights still on the card before its first forward: FSDP1 without sharding (one GPU) moves
    its flat parameters to the CPU but the module's parameter views keep the GPU copy (measured: the first-step peak
    of the recorded SmolLM2 smoke with a reference is 0.51 GiB, its fp32 weights, above the three without)."""
    if not s.ref_used or s.lora_rank > 0 or s.strategy != "fsdp" or s.fsdp != 1:
        return 0.0
    dtype = 4.0 if s.ref_model_dtype.lower() in ("fp32", "float32", "float") else 2.0
    return dtype * arch.params()


def sync_trainer_side(arch: Arch, s: Settings, *, first: bool = False) -> dict[str, float]:
    """What the trainer's torch allocator holds at a weight sync (bytes): the actor's parameters (loaded even with
    param_offload), AdamW's moments unless offloaded (not yet at the first sync, before any step), the exported
    copies, the bucket; at the first sync the reference's leftover copy, later cuBLAS's workspaces."""
    st = actor_state(arch, s)
    out = {"actor_params_and_optimizer": st.params + (0.0 if (s.optimizer_offload or first) else st.optimizer),
           "exported_copies": sync_copies(arch, s), "bucket": s.bucket_mb * MiB}
    if first:
        out["reference_left_on_card"] = reference_on_card_at_start(arch, s)
    else:
        out["cublas_workspaces"] = CUBLAS_WORKSPACE_GB * GB
    return out


def weight_sync_phase(arch: Arch, s: Settings) -> dict[str, Any]:
    trainer = sync_trainer_side(arch, s)
    weights = vllm_weights(arch, s)
    ctx = (TRAINER_CUDA_CONTEXT_GB + VLLM_CUDA_CONTEXT_GB) * GB
    peak = sum(trainer.values()) + weights + ctx
    return {"peak_gb_per_gpu": _gb(peak),
            "components_gb": {**{k: _gb(v) for k, v in trainer.items()}, "vllm_weights": _gb(weights),
                              "cuda_contexts": _gb(ctx)}}


def update_breakdown(arch: Arch, s: Settings) -> dict[str, float]:
    """Bytes torch's allocator holds at the update's peak on one GPU (the larger of the two candidate peaks)."""
    peaks = update_peaks(arch, s)
    return max(peaks.values(), key=lambda d: sum(d.values()))


def update_peak_at(arch: Arch, s: Settings) -> str:
    peaks = update_peaks(arch, s)
    return max(peaks, key=lambda k: sum(peaks[k].values()))


def optimizer_step_bytes(arch: Arch, s: Settings) -> float:
    st = actor_state(arch, s)
    return st.total + param_bytes(s) * st.trainable / s.fsdp


def training_subphases(arch: Arch, s: Settings) -> dict[str, dict[str, float]]:
    """Components (bytes, allocator view) of the training phase's four candidate peaks."""
    st = actor_state(arch, s)
    resident = resident_between_phases(arch, s)
    out = {"update": update_breakdown(arch, s),
           "optimizer_step": {"actor_state": st.total, "adam_temporary": param_bytes(s) * st.trainable / s.fsdp}}
    # old log-prob: actor forward (params loaded; the optimizer stays where it is), entropy for the metrics
    t_lp = s.log_prob_tokens
    out["old_log_prob"] = {
        "actor_params_and_optimizer": st.params + (0.0 if s.optimizer_offload else st.optimizer),
        "fsdp_gathered": fsdp_gathered(arch, s, backward=False),
        "forward_activations": t_lp * arch.layer_forward_bytes_per_token() + attention_extra(arch, s, t_lp, False),
        "logits": logits_peak(arch, t_lp, update=False, entropy=True, chunked=s.actor_entropy_chunking,
                              chunk=s.entropy_chunk_size, compiled=s.use_torch_compile)}
    # reference forward: the actor's resident state beside it; the reference streams fp32 shards in, gathers bf16
    if s.ref_used:
        t_ref = s.ref_log_prob_tokens
        if s.lora_rank > 0:  # the reference is the actor with its adapters disabled
            stream = fsdp_gathered(arch, s, backward=False)
        else:
            stream = (4.0 / s.fsdp + 2.0) * (arch.root_params() + 2 * arch.layer_params())
        out["ref_log_prob"] = {
            "actor_resident": resident, "reference_streamed": stream,
            "forward_activations": (t_ref * arch.layer_forward_bytes_per_token()
                                    + attention_extra(arch, s, t_ref, False)),
            "logits": logits_peak(arch, t_ref, update=False, entropy=False, chunked=False, chunk=0)}
    for sub in out.values():
        sub["cublas_workspaces"] = CUBLAS_WORKSPACE_GB * GB
    return out


def trainer_allocator(arch: Arch, s: Settings) -> dict[str, Any]:
    """The trainer process's torch-allocator peak over all its phases: what verl logs as
    actor/perf/max_memory_allocated_gb (reserved adds the allocator's cache: not knowable before the run)."""
    peaks = {k: sum(v.values()) for k, v in training_subphases(arch, s).items()}
    peaks["weight_sync"] = sum(sync_trainer_side(arch, s).values())
    peaks["first_weight_sync"] = sum(sync_trainer_side(arch, s, first=True).values())
    worst_name = max(peaks, key=peaks.get)
    return {"peak_gb": _gb(peaks[worst_name]), "peak_of": worst_name.replace("_", " "),
            "peaks_gb": {k: _gb(v) for k, v in peaks.items()},
            "what": "the trainer's torch-allocator peak over all its phases (verl's actor/perf/max_memory_*_gb)"}


def training_phase(arch: Arch, s: Settings) -> dict[str, Any]:
    subs = training_subphases(arch, s)
    totals = {k: sum(v.values()) for k, v in subs.items()}
    names = {"update": f"update ({update_peak_at(arch, s).replace('_', ' ')})", "optimizer_step": "optimizer step",
             "old_log_prob": "old-log-prob forward", "ref_log_prob": "reference forward"}
    worst_name = max(totals, key=totals.get)
    asleep = (VLLM_CUDA_CONTEXT_GB + (0.0 if s.enforce_eager else VLLM_CUDAGRAPH_GB)) * GB
    vllm = asleep if s.free_cache_engine else sum(engine_budget(arch, s)[:2]) + VLLM_CUDA_CONTEXT_GB * GB  # engine hook
    ctx = TRAINER_CUDA_CONTEXT_GB * GB
    peak = totals[worst_name] + vllm + ctx
    return {"peak_gb_per_gpu": _gb(peak),
            "peak_of": names[worst_name],
            "tokens_per_micro_batch": s.update_tokens,
            "sub_peaks_gb": {k: _gb(v) for k, v in totals.items()},
            "components_gb": {**{k: _gb(v) for k, v in subs[worst_name].items()},
                              "vllm_asleep" if s.free_cache_engine else "vllm_awake": _gb(vllm),
                              "cuda_context": _gb(ctx)}}


def host_ram(arch: Arch, s: Settings) -> dict[str, Any]:
    """Host RAM of one node: its share of the offloaded state, of the CPU-resident reference and of vLLM's level-1
    sleep, its processes, and (on the first node) rank 0 loading the full model at start-up."""
    n = arch.params()
    n_lora = arch.lora_params(s.lora_rank, s.lora_targets)
    trainable = n_lora if s.lora_rank > 0 else n
    groups = max(1, s.n_gpus // s.fsdp)  # replicas of the actor state across FSDP groups (HSDP)
    nodes = max(1, s.nnodes)
    gpus_here = max(1, s.n_gpus // nodes)
    parts = {
        "optimizer_offload": 2 * param_bytes(s) * trainable * groups / nodes if s.optimizer_offload else 0.0,
        "param_offload": param_bytes(s) * (n + n_lora) * groups / nodes if s.param_offload else 0.0,
        "reference_model": 4.0 * n * groups / nodes if (s.ref_used and s.lora_rank == 0) else 0.0,
        # each vLLM replica's bf16 weights go to RAM while it sleeps at level 1
        "vllm_sleep_level1_weights": (2.0 * n * max(1, s.n_gpus // s.tp) / nodes
                                      if s.vllm_sleep_level == 1 else 0.0),
        "activation_offload": (s.update_tokens * arch.num_hidden_layers * arch.hidden_size * 2.0 * gpus_here
                               if s.activation_offload else 0.0),
        "processes": (HOST_BASE_GB + gpus_here * (HOST_PER_GPU_WORKER_GB + HOST_PER_VLLM_WORKER_GB)) * GB,
    }
    steady = sum(parts.values())
    # start-up: rank 0 loads the full model on the CPU in its model dtype, before anything is offloaded
    startup = parts["processes"] + param_bytes(s) * n
    total = max(steady, startup)
    cap = float(s.host_ram_gb or 0)
    return {"total_gb": _gb(total), "steady_gb": _gb(steady), "startup_gb": _gb(startup), "per_node": nodes > 1,
            "components_gb": {k: _gb(v) for k, v in parts.items()},
            "capacity_gb": cap or None, "verdict": verdict_of(total / GB, cap)}


def memory_plan(arch: Arch, s: Settings, *, remedies: bool = True) -> dict[str, Any]:
    """The `memory` section of plan.json."""
    card = s.card_gb
    cal = calibration_of(arch, s)
    gen = generation_phase(arch, s)
    kv = kv_cache(arch, s)
    gen["verdict"] = _generation_verdict(arch, s, cal["generation"]["margin"])
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
        "actor_state_full_gb_per_gpu": _gb(actor_state(arch, s).total),
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


# ---------------------------------------------------------------------------------------------------------------
# remedies: vLLM's max_model_len first (free), then the guide's order: token budget, util, optimizer offload, LoRA;
# then what the guide does not list: rollout TP 2, parameter offload, a smaller weight-sync bucket
# ---------------------------------------------------------------------------------------------------------------

def _margin(arch: Arch, s: Settings, phase: str) -> float:
    from grpo_lab.memory import calibration

    return calibration.phase_calibration(calibration.regime_of(arch, s), phase)["margin"]


def _generation_verdict(arch: Arch, s: Settings, margin: float | None = None) -> str:
    kv = kv_cache(arch, s)
    if kv["tokens"] <= 0 or not kv["fits_max_model_len"]:
        return "oom"  # vLLM refuses to start: no KV cache, or not one max_model_len sequence
    m = _margin(arch, s, "generation") if margin is None else margin
    return verdict_of(generation_phase(arch, s)["peak_gb_per_gpu"], s.card_gb, m, _exact_gb(arch, s, "generation"))


def phase_result(arch: Arch, s: Settings, phase: str) -> tuple[float, str]:
    """(peak GB, verdict) of one phase ("generation", "training", "weight_sync", "host_ram")."""
    if phase == "generation":
        return generation_phase(arch, s)["peak_gb_per_gpu"], _generation_verdict(arch, s)
    if phase == "training":
        peak = training_phase(arch, s)["peak_gb_per_gpu"]
    elif phase == "weight_sync":
        peak = weight_sync_phase(arch, s)["peak_gb_per_gpu"]
    else:
        h = host_ram(arch, s)
        return h["total_gb"], h["verdict"]
    return peak, verdict_of(peak, s.card_gb, _margin(arch, s, phase))


def _best_util(arch: Arch, s: Settings) -> float | None:
    """The highest gpu_memory_utilization (0.05 steps) whose generation phase fits, else the lowest that can start.

    "Can start": vLLM gets a KV cache that holds one max_model_len sequence; higher is more KV (throughput), lower is
    more headroom, so among the tight ones the lowest is taken.
    """
    fits, tight = [], []
    for k in range(19, 1, -1):
        u = round(k * 0.05, 2)
        v = _generation_verdict(arch, replace(s, gpu_memory_utilization=u))
        (fits if v == "fits" else tight if v == "tight" else []).append(u)
    if fits:
        return max(fits)
    return min(tight) if tight else None


def _best_token_budget(arch: Arch, s: Settings) -> int | None:
    """The largest actor token budget (halving from the current, not below one sequence) whose training phase fits."""
    t = s.ppo_max_token_len_per_gpu
    while t > s.seq_len:
        t = max(s.seq_len, t // 2)
        s2 = _with_budget(s, t)
        if phase_result(arch, s2, "training")[1] == "fits":
            return t
    return max(s.seq_len, t) if t != s.ppo_max_token_len_per_gpu else None


def _with_budget(s: Settings, t: int) -> Settings:
    return replace(s, ppo_max_token_len_per_gpu=t,
                   log_prob_max_token_len_per_gpu=max(s.seq_len, min(s.log_prob_max_token_len_per_gpu, 2 * t)),
                   ref_log_prob_max_token_len_per_gpu=max(s.seq_len, min(s.ref_log_prob_max_token_len_per_gpu, 2 * t)))


def candidates(arch: Arch, s: Settings) -> list[tuple[str, Settings]]:
    """(override, settings after it) for each remedy that applies to this configuration, in order."""
    out: list[tuple[str, Settings]] = []
    seq = s.seq_len
    if not s.max_model_len and (arch.max_position_embeddings or 0) > seq:
        out.append((f"actor_rollout_ref.rollout.max_model_len={seq}", replace(s, max_model_len=seq)))
    if s.use_dynamic_bsz:
        t = _best_token_budget(arch, s)
        if t is not None:
            s2 = _with_budget(s, t)
            out.append((f"ppo_max_token_len_per_gpu={t} "
                        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={s2.log_prob_max_token_len_per_gpu} "
                        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={s2.ref_log_prob_max_token_len_per_gpu}",
                        s2))
    elif (s.ppo_micro_batch_size_per_gpu or 1) > 1:
        m = max(1, (s.ppo_micro_batch_size_per_gpu or 1) // 2)
        out.append((f"ppo_micro_batch_size_per_gpu={m}", replace(s, ppo_micro_batch_size_per_gpu=m)))
    u = _best_util(arch, s)
    if u is not None and abs(u - s.gpu_memory_utilization) > 1e-6:
        out.append((f"rollout_gpu_mem_util={u}", replace(s, gpu_memory_utilization=u)))
    if not s.optimizer_offload:
        out.append(("actor_rollout_ref.actor.fsdp_config.optimizer_offload=true", replace(s, optimizer_offload=True)))
    if s.lora_rank == 0:
        big = arch.params() > 6e9
        override = LORA_OVERRIDES + (" " + OFFLOAD_OVERRIDES if big else "")
        out.append((override, replace(s, lora_rank=64, param_offload=big or s.param_offload,
                                      optimizer_offload=big or s.optimizer_offload)))
    tp2 = s.tp * 2
    if s.n_gpus % tp2 == 0 and arch.num_attention_heads % tp2 == 0:
        out.append((f"rollout_tp={tp2}", replace(s, tp=tp2)))
    if not s.param_offload:
        out.append(("actor_rollout_ref.actor.fsdp_config.param_offload=true", replace(s, param_offload=True)))
    if s.bucket_mb > 512:
        b = max(512, s.bucket_mb // 4)
        out.append((f"actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes={b}",
                    replace(s, bucket_mb=b)))
    return out


def _improves(before: tuple[float, str], after: tuple[float, str]) -> bool:
    return _ORDER[after[1]] < _ORDER[before[1]] or (after[1] == before[1] and after[0] < before[0] - 0.05)


_FREE = "actor_rollout_ref.rollout.max_model_len"  # costs nothing (GRPO never generates past prompt + response)


def _key(override: str) -> str:
    return override.split("=")[0]


def find_remedies(arch: Arch, s: Settings, phase: str) -> list[dict[str, Any]]:
    """Remedies that improve this phase (better verdict, or a lower peak), each with the peak and verdict after it.

    When no single one ends an `oom`, a last entry (combined: true) applies them one after another, in order, each
    chosen on top of the previous, until the phase no longer runs out of memory.
    """
    before = phase_result(arch, s, phase)
    out = []
    for override, s2 in candidates(arch, s):
        after = phase_result(arch, s2, phase)
        if _improves(before, after):
            out.append({"override": override, "peak_gb_per_gpu": after[0], "verdict": after[1]})
    if before[1] == "oom" and not any(r["verdict"] != "oom" for r in out):
        combo: list[str] = []
        cur, cur_s = before, s
        for _ in range(8):
            step = next(((o, s2) for o, s2 in candidates(arch, cur_s)
                         if _key(o) not in {_key(c) for c in combo}
                         and (_key(o) == _FREE or _improves(cur, phase_result(arch, s2, phase)))),
                        None)
            if step is None:
                break
            combo.append(step[0])
            cur_s = step[1]
            cur = phase_result(arch, cur_s, phase)
            if cur[1] != "oom":
                break
        if len(combo) > 1:
            out.append({"override": " ".join(combo), "peak_gb_per_gpu": cur[0], "verdict": cur[1], "combined": True})
    return out
