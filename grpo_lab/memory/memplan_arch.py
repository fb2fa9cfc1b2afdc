"""The memory plan's inputs: the model's shapes (`Arch`, from a config.json-like mapping: parameter counts, per-token
sizes, mixture of experts) and the knobs of a run that move memory (`Settings`, read from a resolved verl config by
grpo_lab/memory/settings.py's settings_from_verl). No phase arithmetic here: that is
grpo_lab/memory/memplan_phases.py; the plan itself is grpo_lab/memory/memplan.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Arch:
    """The architecture facts the plan needs (Qwen3 / Llama-style decoder with SwiGLU MLP and q/k norms).

    Mixture of experts (Qwen3-MoE's config.json: num_experts, num_experts_per_tok, moe_intermediate_size,
    decoder_sparse_step, mlp_only_layers): a sparse layer holds num_experts SwiGLU experts and a router; every expert
    is a parameter, so weights, gradients, Adam state and vLLM's weights count them all (`params`), while a token
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
    def from_mapping(cls, d: Mapping[str, Any], source: str = "") -> Arch:
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

    # ---- parameter counts (computed once per architecture: the plans and make fit's search read them often) ----
    def linear_shapes(self, intermediate: int | None = None) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder layer (of one expert's MLP for a sparse layer)."""
        h, i = self.hidden_size, self.intermediate_size if intermediate is None else intermediate
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def _attention_params(self) -> int:
        return sum(a * b for k, (a, b) in self.linear_shapes().items() if k in ("q_proj", "k_proj", "v_proj", "o_proj"))

    def _norm_params(self) -> int:
        return 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)

    def _dense_layer_params(self) -> int:
        return sum(a * b for a, b in self.linear_shapes().values()) + self._norm_params()

    def _sparse_layer_params(self, experts: int) -> int:
        expert = 3 * self.hidden_size * self.moe_intermediate_size
        router = self.hidden_size * self.num_experts
        return self._attention_params() + experts * expert + router + self._norm_params()

    @cached_property
    def layer_params(self) -> int:
        """Parameters of the largest decoder layer (what FSDP gathers at once for one layer)."""
        return self._sparse_layer_params(self.num_experts) if self.is_moe else self._dense_layer_params()

    @cached_property
    def root_params(self) -> int:
        """Parameters outside the decoder layers: embeddings, lm_head (unless tied), final norm (FSDP's root unit)."""
        emb = self.vocab_size * self.hidden_size
        return emb * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    def _model_params(self, experts: int) -> int:
        """Parameters of the whole model with `experts` experts in each sparse layer."""
        sparse = self.sparse_layers if self.is_moe else 0
        return ((self.num_hidden_layers - sparse) * self._dense_layer_params()
                + sparse * self._sparse_layer_params(experts) + self.root_params)

    @cached_property
    def params(self) -> int:
        """All parameters (every expert of an MoE): what weights, gradients, optimizer and vLLM hold."""
        return self._model_params(self.num_experts)

    @cached_property
    def active_params(self) -> int:
        """Parameters one token passes through (num_experts_per_tok experts of each sparse layer)."""
        return self._model_params(self.num_experts_per_tok)

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
    @cached_property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token in bf16: 2 x layers x kv_heads x head_dim x 2 B."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 2

    @cached_property
    def layer_activation_bytes_per_token(self) -> int:
        """What one decoder layer saves for its backward per token (bf16 tensors, fp32 RMSNorm inputs)."""
        h, i = self.hidden_size, self.active_intermediate
        heads = (self.num_attention_heads + self.num_key_value_heads) * self.head_dim
        return 16 * h + 8 * i + 12 * heads

    @cached_property
    def layer_forward_bytes_per_token(self) -> int:
        """Transient of one layer's forward without autograd (hidden, qkv, MLP gate/up and product)."""
        h, i = self.hidden_size, self.active_intermediate
        qkv = (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim
        return 2 * (4 * h + qkv + 3 * i)


@dataclass(frozen=True)
class Settings:
    """The knobs of a run that move memory (read from a verl config by memory.settings.settings_from_verl)."""

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
    use_remove_padding: bool = True  # model.use_remove_padding: packed micro-batches; false: each padded to its longest
    use_dynamic_bsz: bool = True
    ppo_max_token_len_per_gpu: int = 16384
    ppo_micro_batch_size_per_gpu: int | None = None
    entropy_in_update: bool = False
    entropy_checkpointing: bool = False
    actor_entropy_chunking: bool = False
    entropy_chunk_size: int = 2048
    use_torch_compile: bool = True
    use_fused_kernels: bool = False  # model.use_fused_kernels: log-probs from the hidden states in chunks (time plan)
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
    ref_param_offload: bool = False
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
    ppo_mini_batch_size: int = 0  # prompts; 0: the whole batch (one update)
    ppo_epochs: int = 1

    @property
    def seq_len(self) -> int:
        return self.max_prompt_length + self.max_response_length

    @property
    def packed_attention(self) -> bool:
        """Packed micro-batches without flash-attn: sdpa and eager attend across all of a micro-batch's answers under
        a block-diagonal mask (flash-attn's varlen kernel and padded micro-batches stay within each answer)."""
        return self.use_remove_padding and not self.attn_implementation.startswith("flash")

    @property
    def fsdp(self) -> int:
        """GPUs one actor shard is split over."""
        return self.fsdp_size if 0 < self.fsdp_size < self.n_gpus else self.n_gpus

    def _tokens(self, dynamic: bool, budget: int, micro: int | None) -> int:
        """Tokens in one micro-batch of a pass on one GPU: its token budget, else its micro-batch of sequences."""
        return int(budget) if dynamic else int(micro or 1) * self.seq_len

    @property
    def update_tokens(self) -> int:
        return self._tokens(self.use_dynamic_bsz, self.ppo_max_token_len_per_gpu, self.ppo_micro_batch_size_per_gpu)

    @property
    def log_prob_tokens(self) -> int:
        return self._tokens(self.log_prob_use_dynamic_bsz, self.log_prob_max_token_len_per_gpu,
                            self.log_prob_micro_batch_size_per_gpu)

    @property
    def ref_log_prob_tokens(self) -> int:
        return self._tokens(self.ref_log_prob_use_dynamic_bsz, self.ref_log_prob_max_token_len_per_gpu,
                            self.ref_log_prob_micro_batch_size_per_gpu)

    @property
    def vllm_sleep_level(self) -> int:
        # verl: level 1 for LoRA adapters (not merged) and layered_summon, else level 2 (vLLM >= 0.18)
        return 1 if (self.lora_rank > 0 or self.layered_summon) else 2
