"""The memory plan's arithmetic: the bytes each phase of one GRPO step of verl 0.9.1 puts on a GPU and in host RAM.

The phases it covers, and what each assumes and why: docs/memory_plan.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from grpo_lab.memory import engines
from grpo_lab.memory.memplan_arch import Arch, Settings

GB = 1e9
MiB = 1 << 20

# ---- documented constants (docs/memory_plan.md) ----
# measured on the H200 (benchmarks/gpu/memplan_calibration.md): 1.235 GB outside torch's allocator after the first FSDP
# build (CUDA context 0.51 GiB + NCCL 0.64 GiB); less on cards with smaller contexts, so an upper bound
TRAINER_CUDA_CONTEXT_GB = 1.25   # the FSDP worker's CUDA context + NCCL buffers (outside torch's allocator)
# the vLLM worker's memory outside its util budget, what its level-2 sleep leaves: 0.82-0.85 GiB on the H200 (eager)
VLLM_CUDA_CONTEXT_GB = 0.9
CONTEXTS = (TRAINER_CUDA_CONTEXT_GB + VLLM_CUDA_CONTEXT_GB) * GB  # both processes' on one card (bytes)
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
FUSED_CHUNK = 512                # verl's FusedLinearForPPO (use_fused_kernels): log-probs this many tokens at a time
FUSED_FORWARD_BYTES = 14.0       # per chunk token x vocab, forward: fp32 logits, softmax, their product, bf16 logits
FUSED_BACKWARD_BYTES = 20.0      # per chunk token x vocab, backward: fp32 logits, softmax, one-hot, difference, grad
HOST_PER_GPU_WORKER_GB = 3.0     # RSS of one FSDP worker process (torch, CUDA libraries, model code)
HOST_PER_VLLM_WORKER_GB = 3.0    # RSS of one vLLM worker process
HOST_BASE_GB = 6.0               # Ray, TaskRunner, reward workers, data loaders


# ---- components (bytes) ----

@dataclass
class ActorState:
    params: float       # fp32 parameters (base + adapters), sharded
    grads: float        # fp32 gradients of the trainable parameters, sharded
    optimizer: float    # AdamW moments, fp32, sharded
    trainable: int      # trainable parameter count (whole model)

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def dtype_bytes(dtype: str) -> float:
    """Bytes per parameter of an FSDP model_dtype: 4 for fp32, 2 for bf16/fp16."""
    return 4.0 if str(dtype).lower() in ("fp32", "float32", "float") else 2.0


def param_bytes(s: Settings) -> float:
    """Bytes per actor parameter as FSDP keeps it: fp32 by default (fsdp_config.model_dtype), 2 for bf16/fp16."""
    return dtype_bytes(s.model_dtype)


def actor_state(arch: Arch, s: Settings) -> ActorState:
    """Per-GPU actor state with everything on the card (what the update needs): grads and AdamW's moments in the
    parameters' dtype (fp32: 4 + 4 + 8 = 16 B per trainable parameter)."""
    n_lora = arch.lora_params(s.lora_rank, s.lora_targets)
    trainable = n_lora if s.lora_rank > 0 else arch.params
    f = s.fsdp
    pb = param_bytes(s)
    return ActorState(params=pb * (arch.params + n_lora) / f, grads=pb * trainable / f,
                      optimizer=2 * pb * trainable / f, trainable=trainable)


def actor_state_gb_per_gpu(arch: Arch, s: Settings) -> float:
    """The guide's accounting: 16 B per trainable parameter (4 B per frozen one) / FSDP size, minus offloaded parts."""
    st = actor_state(arch, s)
    return (st.total - (st.params + st.grads if s.param_offload else 0.0)
            - (st.optimizer if s.optimizer_offload else 0.0)) / GB


def resident_between_phases(arch: Arch, s: Settings) -> float:
    """Actor bytes that stay on a GPU while vLLM runs: params unless offloaded, Adam unless offloaded (grads freed)."""
    st = actor_state(arch, s)
    return (0.0 if s.param_offload else st.params) + (0.0 if s.optimizer_offload else st.optimizer)


def activations(arch: Arch, s: Settings, tokens: int) -> float:
    """Saved activations of one micro-batch of `tokens` tokens in the update (bytes)."""
    per_layer = arch.layer_activation_bytes_per_token
    L = arch.num_hidden_layers
    if s.gradient_checkpointing:
        kept_layers = 2 if s.activation_offload else L
        act = tokens * kept_layers * arch.hidden_size * 2 + tokens * per_layer
    else:
        act = tokens * L * per_layer
    return act + attention_extra(arch, s, tokens, training=True)


def attention_extra(arch: Arch, s: Settings, tokens: int, training: bool) -> float:
    """Without flash-attn, the attention mask (and eager's scores) of a micro-batch: over the whole micro-batch when it
    is packed (sdpa takes a dense T x T block-causal mask), over each answer's row when it is padded (B x L x L)."""
    impl = s.attn_implementation
    if impl.startswith("flash"):
        return 0.0
    span = tokens if s.packed_attention else min(tokens, s.seq_len)  # the keys each query's mask row covers
    extra = tokens * span * 1.0  # the boolean mask, shared by the layers
    if impl == "sdpa" and training and not s.gradient_checkpointing:
        # each layer's sdpa turns it into a bf16 additive mask that its backward keeps (results/2026-12-04-speed)
        extra += arch.num_hidden_layers * tokens * span * 2.0
    if impl == "eager":
        layers = arch.num_hidden_layers if (training and not s.gradient_checkpointing) else 1
        extra += layers * tokens * span * arch.num_attention_heads * (2 + 4)
    return extra


def logits_peak(arch: Arch, tokens: int, *, update: bool, entropy: bool, chunked: bool, chunk: int,
                checkpointed: bool = False, compiled: bool = True, fused: bool = False) -> float:
    """The vocabulary-sized tensors of one micro-batch (bytes): docs/memory_plan.md, "Logits peak"."""
    v = arch.vocab_size
    if fused:  # no whole logits: one chunk's at a time, entropy included, recomputed in the backward
        per = FUSED_BACKWARD_BYTES + (ENTROPY_EAGER_BYTES if entropy else 0.0) if update else FUSED_FORWARD_BYTES
        return min(FUSED_CHUNK, tokens) * v * per
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
    """Unsharded bf16 copies FSDP holds at once: the root unit (embeddings, lm_head, final norm; + its bf16 gradient
    in backward, the first one the backward makes) and two layers."""
    root = arch.root_params
    root_grad = 2.0 * root if (backward and s.lora_rank == 0) else 0.0
    return 2.0 * root + root_grad + 2 * 2.0 * arch.layer_params


def update_peaks(arch: Arch, s: Settings) -> dict[str, dict[str, float]]:
    """The two candidate peaks of the update, at the start and the end of the backward (bytes torch's allocator
    holds; no CUDA context, no vLLM): docs/memory_plan.md, "Training"."""
    t = s.update_tokens
    st = actor_state(arch, s)
    root = arch.root_params
    start = {
        "actor_params_and_optimizer": st.params + st.optimizer,
        "fsdp_gathered": fsdp_gathered(arch, s, backward=True),
        "activations": activations(arch, s, t),
        "logits": logits_peak(arch, t, update=True, entropy=s.entropy_in_update, chunked=s.actor_entropy_chunking,
                              chunk=s.entropy_chunk_size, checkpointed=s.entropy_checkpointing,
                              compiled=s.use_torch_compile, fused=s.use_fused_kernels),
    }
    end = {
        "actor_state": st.total,
        "fsdp_gathered": 2.0 * root + 2.0 * arch.layer_params,
        "root_grad_reduce": (2.0 + 4.0) * root if s.lora_rank == 0 else 0.0,
    }
    return {"backward_start": start, "backward_end": end}


def vllm_weights(arch: Arch, s: Settings) -> float:
    return 2.0 * arch.params / s.tp


def vllm_max_model_len(arch: Arch, s: Settings) -> int:
    return int(s.max_model_len or arch.max_position_embeddings or s.seq_len)


def vllm_batched_tokens(arch: Arch, s: Settings) -> int:
    if s.enable_chunked_prefill:
        return s.max_num_batched_tokens
    return max(s.max_num_batched_tokens, vllm_max_model_len(arch, s))


def cudagraphs(s: Settings) -> float:
    """vLLM's CUDA graph pool (bytes): none under enforce_eager."""
    return 0.0 if s.enforce_eager else VLLM_CUDAGRAPH_GB * GB


def vllm_activation(arch: Arch, s: Settings) -> float:
    """vLLM's profiled activation peak: one layer over max_num_batched_tokens tokens + sampler logits."""
    t = vllm_batched_tokens(arch, s)
    h, i = arch.hidden_size, arch.active_intermediate
    return t * (8 * h + 6 * i) / s.tp + s.max_num_seqs * arch.vocab_size * 4 * 3


def round_gb(x: float) -> float:
    return round(x / GB, 2)


# ---- rollout engine hook (grpo_lab/memory/engines.py): vLLM's budget is util x card and holds its activations;
# SGLang's is util x the memory free when it starts (after the actor's parameters), for weights + KV, activations
# on top ----
def engine_budget(arch: Arch, s: Settings) -> tuple[float, float, str]:
    """(static budget bytes, bytes the engine adds on top of it while generating, one-sentence rule) per GPU."""
    if s.vllm_kv_cache_bytes and s.rollout_engine == "vllm":
        # a pinned cache: vLLM's own memory is its weights, activations and CUDA graphs plus exactly this
        rest = vllm_weights(arch, s) + vllm_activation(arch, s) + cudagraphs(s)
        budget = rest + s.vllm_kv_cache_bytes
        return budget, 0.0, (f"vLLM: engine_kwargs.vllm.kv_cache_memory_bytes pins its KV cache at "
                             f"{s.vllm_kv_cache_bytes / GB:.2f} GB (gpu_memory_utilization does not size it): with its "
                             f"weights, activations and CUDA graphs ({rest / GB:.2f} GB) {budget / GB:.2f} GB")
    at_start = ((0.0 if s.param_offload else actor_state(arch, s).params) / GB
                + reference_on_card_at_start(arch, s) / GB + TRAINER_CUDA_CONTEXT_GB + VLLM_CUDA_CONTEXT_GB)
    e, u = s.rollout_engine, s.gpu_memory_utilization
    card = card_bytes(s) / GB  # the engines take their fraction of the card's real bytes
    static, rule = engines.static_budget_gb(e, u, card, at_start), engines.explain(e, u, card, at_start)
    extra = 0.0 if engines.budget_holds_activations(e) else (
        vllm_activation(arch, replace(s, enable_chunked_prefill=True))  # SGLang chunks its prefill by default
        + cudagraphs(s))
    return static * GB, extra, rule


def card_bytes(s: Settings) -> float:
    """The card's real bytes, what vLLM's util and SGLang's fraction apply to: gpu_memory_gb x 2^30 (GiB, as CUDA
    reports it; 139.8 on an H200 = 150.1e9 bytes). Verdicts read the same number as GB, ~7% below it."""
    return s.card_gb * CARD_UNIT_BYTES


def answer_rounds(answers: int, cache_tokens: float, sequence_tokens: float, max_seqs: int) -> tuple[int, int | None]:
    """(how many sequences of sequence_tokens a KV cache of cache_tokens holds at once, at most max_seqs; the rounds
    `answers` take in it, None where not one fits)."""
    concurrent = min(int(cache_tokens // sequence_tokens), max_seqs) if sequence_tokens > 0 else 0
    return concurrent, (math.ceil(answers / concurrent) if concurrent > 0 else None)


def kv_cache(arch: Arch, s: Settings, budget: tuple[float, float, str] | None = None) -> dict[str, Any]:
    budget, on_top, rule = budget or engine_budget(arch, s)  # engine hook
    graphs = cudagraphs(s)
    weights = vllm_weights(arch, s)
    act = vllm_activation(arch, s)
    kv_bytes_gpu = budget - weights - (0.0 if on_top else act + graphs)  # engine hook: SGLang's are outside
    per_token_gpu = arch.kv_bytes_per_token / s.tp
    tokens = int(kv_bytes_gpu // per_token_gpu) if kv_bytes_gpu > 0 else 0
    seq = s.seq_len
    sequences = tokens // seq if seq else 0
    replicas = max(1, s.n_gpus // (s.tp * max(1, s.rollout_dp)))  # a replica's GPUs: TP x DP
    per_replica = math.ceil(s.train_batch_size * s.rollout_n / replicas)
    concurrent, waves = answer_rounds(per_replica, tokens, seq, s.max_num_seqs)
    return {
        "engine": s.rollout_engine,  # engine hook
        "budget_rule": rule,  # engine hook
        "budget_gb": round_gb(budget),
        "vllm_weights_gb": round_gb(weights),
        "vllm_activation_gb": round_gb(act),
        "cudagraph_gb": round_gb(graphs),
        "kv_cache_gb": round_gb(max(0.0, kv_bytes_gpu)),
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


def sync_copies(arch: Arch, s: Settings) -> float:
    """Bytes of the weights the trainer materialises to send them to the rollout (beside the bucket): with FSDP1 on
    one GPU a FULL_STATE_DICT, else one full tensor at a time; docs/memory_plan.md, "The trainer's torch allocator"."""
    emb = arch.vocab_size * arch.hidden_size
    if s.lora_rank > 0:
        return 4.0 * arch.layer_params if s.layered_summon else 4.0 * emb
    if s.strategy == "fsdp" and s.n_gpus == 1:
        return param_bytes(s) * (arch.params + (emb if arch.tie_word_embeddings else 0))
    return 4.0 * emb


def reference_on_card_at_start(arch: Arch, s: Settings) -> float:
    """The reference's weights still on the card before its first forward (FSDP1 on one GPU: docs/memory_plan.md)."""
    if not s.ref_used or s.lora_rank > 0 or s.strategy != "fsdp" or s.fsdp != 1:
        return 0.0
    return dtype_bytes(s.ref_model_dtype) * arch.params


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


def update_breakdown(arch: Arch, s: Settings) -> dict[str, float]:
    """Bytes torch's allocator holds at the update's peak on one GPU (the larger of the two candidate peaks)."""
    return update_peaks(arch, s)[update_peak_at(arch, s)]


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
        "forward_activations": t_lp * arch.layer_forward_bytes_per_token + attention_extra(arch, s, t_lp, False),
        "logits": logits_peak(arch, t_lp, update=False, entropy=True, chunked=s.actor_entropy_chunking,
                              chunk=s.entropy_chunk_size, compiled=s.use_torch_compile, fused=s.use_fused_kernels)}
    # reference forward: the actor's resident state beside it; the reference streams fp32 shards in, gathers bf16
    if s.ref_used:
        t_ref = s.ref_log_prob_tokens
        if s.lora_rank > 0:  # the reference is the actor with its adapters disabled
            stream = fsdp_gathered(arch, s, backward=False)
        else:
            stream = (4.0 / s.fsdp + 2.0) * (arch.root_params + 2 * arch.layer_params)
        out["ref_log_prob"] = {
            "actor_resident": resident, "reference_streamed": stream,
            "forward_activations": (t_ref * arch.layer_forward_bytes_per_token
                                    + attention_extra(arch, s, t_ref, False)),
            "logits": logits_peak(arch, t_ref, update=False, entropy=False, chunked=False, chunk=0,
                                  fused=s.use_fused_kernels)}
    for sub in out.values():
        sub["cublas_workspaces"] = CUBLAS_WORKSPACE_GB * GB
    return out


def trainer_allocator(arch: Arch, s: Settings, subs: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """The trainer process's torch-allocator peak over all its phases: what verl logs as
    actor/perf/max_memory_allocated_gb (reserved adds the allocator's cache: not knowable before the run)."""
    peaks = {k: sum(v.values()) for k, v in (subs or training_subphases(arch, s)).items()}
    peaks["weight_sync"] = sum(sync_trainer_side(arch, s).values())
    peaks["first_weight_sync"] = sum(sync_trainer_side(arch, s, first=True).values())
    worst_name = max(peaks, key=peaks.get)
    return {"peak_gb": round_gb(peaks[worst_name]), "peak_of": worst_name.replace("_", " "),
            "peaks_gb": {k: round_gb(v) for k, v in peaks.items()},
            "what": "the trainer's torch-allocator peak over all its phases (verl's actor/perf/max_memory_*_gb)"}


def training_phase(arch: Arch, s: Settings, budget: tuple[float, float, str] | None = None,
                   subs: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    subs = subs or training_subphases(arch, s)
    totals = {k: sum(v.values()) for k, v in subs.items()}
    names = {"update": f"update ({update_peak_at(arch, s).replace('_', ' ')})", "optimizer_step": "optimizer step",
             "old_log_prob": "old-log-prob forward", "ref_log_prob": "reference forward"}
    worst_name = max(totals, key=totals.get)
    asleep = VLLM_CUDA_CONTEXT_GB * GB + cudagraphs(s)
    awake = sum((budget or engine_budget(arch, s))[:2]) + VLLM_CUDA_CONTEXT_GB * GB  # engine hook
    vllm = asleep if s.free_cache_engine else awake
    ctx = TRAINER_CUDA_CONTEXT_GB * GB
    peak = totals[worst_name] + vllm + ctx
    return {"peak_gb_per_gpu": round_gb(peak),
            "peak_of": names[worst_name],
            "tokens_per_micro_batch": s.update_tokens,
            "sub_peaks_gb": {k: round_gb(v) for k, v in totals.items()},
            "components_gb": {**{k: round_gb(v) for k, v in subs[worst_name].items()},
                              "vllm_asleep" if s.free_cache_engine else "vllm_awake": round_gb(vllm),
                              "cuda_context": round_gb(ctx)}}


def host_ram(arch: Arch, s: Settings) -> dict[str, Any]:
    """Host RAM of one node: its share of the offloaded state, of the CPU-resident reference and of vLLM's level-1
    sleep, its processes, and (on the first node) rank 0 loading the full model at start-up."""
    n, trainable = arch.params, actor_state(arch, s).trainable
    n_lora = arch.lora_params(s.lora_rank, s.lora_targets)
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
    return {"total_gb": round_gb(total), "steady_gb": round_gb(steady), "startup_gb": round_gb(startup),
            "per_node": nodes > 1, "components_gb": {k: round_gb(v) for k, v in parts.items()},
            "capacity_gb": float(s.host_ram_gb or 0) or None}


def _of(plan: Any, *parts: str) -> Any:
    """A Phases attribute that is plan(arch, s, *those of its attributes), computed once, when first read."""
    return cached_property(lambda self: plan(self.arch, self.s, *(getattr(self, p) for p in parts)))


class Phases:
    """One configuration's phases (GB; the dicts plan.json shows), each computed once, when first read."""

    def __init__(self, arch: Arch, s: Settings) -> None:
        self.arch, self.s = arch, s

    budget = _of(engine_budget)
    subphases = _of(training_subphases)
    host = _of(host_ram)
    actor_state_gb = _of(actor_state_gb_per_gpu)
    kv = _of(kv_cache, "budget")
    training = _of(training_phase, "budget", "subphases")
    trainer_allocator = _of(trainer_allocator, "subphases")

    @cached_property
    def generation(self) -> dict[str, Any]:
        resident = resident_at_generation(self.arch, self.s)
        vllm, on_top, _ = self.budget  # engine hook
        engine = ({"vllm_budget": round_gb(vllm)} if not on_top
                  else {"sglang_static": round_gb(vllm), "sglang_activations": round_gb(on_top)})
        return {"peak_gb_per_gpu": round_gb(resident + vllm + on_top + CONTEXTS),
                "components_gb": {"actor_resident": round_gb(resident), **engine, "cuda_contexts": round_gb(CONTEXTS)}}

    @cached_property
    def weight_sync(self) -> dict[str, Any]:
        trainer = sync_trainer_side(self.arch, self.s)
        weights = vllm_weights(self.arch, self.s)
        return {"peak_gb_per_gpu": round_gb(sum(trainer.values()) + weights + CONTEXTS),
                "components_gb": {**{k: round_gb(v) for k, v in trainer.items()}, "vllm_weights": round_gb(weights),
                                  "cuda_contexts": round_gb(CONTEXTS)}}

    @cached_property
    def actor_state_full_gb(self) -> float:
        return round_gb(actor_state(self.arch, self.s).total)

    @property
    def exact_generation_gb(self) -> float:
        """The engine's static budget: the part of the generation phase's peak known exactly."""
        return self.budget[0] / GB

    def peak_gb(self, phase: str) -> float:
        return self.host["total_gb"] if phase == "host_ram" else getattr(self, phase)["peak_gb_per_gpu"]
