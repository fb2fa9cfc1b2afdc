"""The fit's moves, each a setting a user can change without changing what is trained, picking its own value given the
settings so far (or saying why it does not apply), in the guide's order of preference (MOVES); a setting's judgement
(`Eval`) and what a move asks of the search to judge one (`Judge`). The search, and how it judges a setting, is
grpo_lab/memory/fit_search.py; the entry point grpo_lab/checks/fit.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from grpo_lab import facts
from grpo_lab.memory import memplan, timeplan
from grpo_lab.memory.memplan_remedies import UTILS, budget_changes, halvings
from grpo_lab.memory.settings import FIELD_OF_KEY
from grpo_lab.verl_keys import A

CONF = facts.ROOT / "conf"
GB = memplan.GB
MARGIN = memplan.TIGHT_FRACTION
PHASES = ("generation", "training", "weight_sync", "host_ram")


# ---- a setting judged, and what a move asks of the search to judge one ----

@dataclass(frozen=True)
class Eval:
    peaks: dict[str, float]
    verdicts: dict[str, str]
    overflow: float   # GB above the target, summed over the phases (plus what vLLM's KV cache lacks)
    kv: dict[str, Any]  # the memory plan's KV cache (what the time plan's generation reads)

    @property
    def fits(self) -> bool:
        return all(v in ("fits", "unknown") for v in self.verdicts.values())

    @property
    def misses(self) -> int:
        return sum(v not in ("fits", "unknown") for v in self.verdicts.values())

    def score(self) -> tuple[int, float]:
        return self.misses, round(self.overflow, 3)


class Judge(Protocol):
    """What a move asks of the search's context (grpo_lab/memory/fit_search.py FitContext)."""

    arch: memplan.Arch

    def eval(self, s: memplan.Settings) -> Eval: ...

    def choice(self, s: memplan.Settings, values: dict[str, Any]) -> tuple[dict[str, Any], memplan.Settings]: ...

    def tokens_per_gpu_per_update(self, s: memplan.Settings) -> int: ...


# ---- moves: each picks its own value given the settings so far, or says why it does not apply ----

Choice = tuple[dict[str, Any], memplan.Settings]


@dataclass(frozen=True)
class Move:
    id: str
    title: str
    rank: int
    choose: Callable[[Judge, memplan.Settings], Choice | str]
    full_ft: bool = True   # a move for full fine-tuning and LoRA alike (False: LoRA only)


def _pick(ctx: Judge, s: memplan.Settings, options: list[Choice]) -> Choice | str:
    """The first option (options come in order of least change) after which every phase it moves fits (the others
    are for later moves to fix); else the one that helps most; else why none helps."""
    if not options:
        return "no value to try"
    e0 = ctx.eval(s)
    for o in options:
        e1 = ctx.eval(o[1])
        moved = [ph for ph in PHASES if abs(e1.peaks[ph] - e0.peaks[ph]) >= 0.005]
        if moved and e1.score() < e0.score() and all(e1.verdicts[ph] in ("fits", "unknown") for ph in moved):
            return o
    best = min(options, key=lambda o: ctx.eval(o[1]).score())
    if ctx.eval(best[1]).score() < e0.score():
        return best
    return "lowers no phase that does not fit"


def _m_max_model_len(ctx: Judge, s: memplan.Settings) -> Choice | str:
    seq = s.seq_len
    mml = memplan.vllm_max_model_len(ctx.arch, s)
    if mml <= seq:
        return f"already {mml} (prompt + response = {seq})"
    return ctx.choice(s, {A + "rollout.max_model_len": seq})


def _m_bucket(ctx: Judge, s: memplan.Settings) -> Choice | str:
    key = A + "rollout.checkpoint_engine.update_weights_bucket_megabytes"
    opts = [ctx.choice(s, {key: b}) for b in halvings(s.bucket_mb, 512)]
    return _pick(ctx, s, opts) if opts else f"already {s.bucket_mb} MiB (512 is the floor here)"


def _switch_on(key: str, why_not: Callable[[memplan.Settings], str] = lambda s: ""
               ) -> Callable[[Judge, memplan.Settings], Choice | str]:
    """A move that turns one boolean setting on, where `why_not` says nothing against it."""
    def move(ctx: Judge, s: memplan.Settings) -> Choice | str:
        why = why_not(s) or ("already on" if getattr(s, FIELD_OF_KEY[key]) else "")
        return why or ctx.choice(s, {key: True})
    return move


def _m_budget(ctx: Judge, s: memplan.Settings) -> Choice | str:
    if not s.use_dynamic_bsz:
        return "dynamic batch size is off (micro-batch sizes instead)"
    seq = s.seq_len
    opts = [_budgets(ctx, s, t, *(c.value for c in budget_changes(s, t)[1:]))
            for t in halvings(s.ppo_max_token_len_per_gpu, seq)]
    return _pick(ctx, s, opts) if opts else f"already one sequence ({seq} tokens): it cannot go lower"


def _budgets(ctx: Judge, s: memplan.Settings, t: int, log_prob: int, ref: int) -> Choice:
    """The three passes' token budgets: the actor's, and each log-prob pass's that changes."""
    vals = {A + "actor.ppo_max_token_len_per_gpu": t}
    if log_prob != s.log_prob_max_token_len_per_gpu:
        vals[A + "rollout.log_prob_max_token_len_per_gpu"] = log_prob
    if ref != s.ref_log_prob_max_token_len_per_gpu:
        vals[A + "ref.log_prob_max_token_len_per_gpu"] = ref
    return ctx.choice(s, vals)



def _m_util(ctx: Judge, s: memplan.Settings) -> Choice | str:
    u0 = s.gpu_memory_utilization
    valid = 0.0 < u0 < 1.0
    if valid and ctx.eval(s).verdicts["generation"] == "fits" and memplan.kv_cache(ctx.arch, s)["fits_max_model_len"]:
        return f"generation fits at {u0:g}"
    # the highest value whose generation phase fits (most KV cache), else whatever helps most
    opts = [ctx.choice(s, {A + "rollout.gpu_memory_utilization": u}) for u in UTILS if abs(u - u0) > 1e-6]
    fitting = [o for o in opts if ctx.eval(o[1]).fits]
    if fitting:
        return fitting[0]
    gen_ok = [o for o in opts if ctx.eval(o[1]).verdicts["generation"] == "fits"]
    if gen_ok:
        best = gen_ok[0]
        if not valid or ctx.eval(best[1]).score() < ctx.eval(s).score():
            return best
    return _pick(ctx, s, opts)


def tp_ok(arch: memplan.Arch, n_gpus: int, tp: int) -> bool:
    kv = arch.num_key_value_heads
    return (n_gpus % tp == 0 and arch.num_attention_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0))


def _m_tp(ctx: Judge, s: memplan.Settings) -> Choice | str:
    opts, tp = [], s.tp * 2
    while tp <= s.n_gpus:
        if tp_ok(ctx.arch, s.n_gpus, tp):
            opts.append(ctx.choice(s, {A + "rollout.tensor_model_parallel_size": tp}))
        tp *= 2
    if not opts:
        return f"TP {s.tp} is the most that {s.n_gpus} GPU(s) and {ctx.arch.num_attention_heads} heads allow"
    return _pick(ctx, s, opts)


def _m_ref_offload(ctx: Judge, s: memplan.Settings) -> Choice | str:
    if not s.ref_used:
        return "no reference model (no KL term)"
    on = ctx.ref_offload
    if on is None or on:
        return "already on (the reference's parameters live in host RAM)"
    # the plan assumes verl streams the reference in per layer either way: no predicted change, so never chosen
    return "the plan already counts the reference in host RAM (verl streams it per layer): no predicted change"


def _divisors_below(n: int, limit: int) -> list[int]:
    return [d for d in range(min(n, limit) - 1, 0, -1) if n % d == 0]


def _m_micro(ctx: Judge, s: memplan.Settings) -> Choice | str:
    if s.use_dynamic_bsz and s.log_prob_use_dynamic_bsz:
        return "dynamic batch size is on (token budgets instead)"
    per_mini = ctx.tokens_per_gpu_per_update(s) // max(1, s.seq_len)
    per_step = s.train_batch_size * s.rollout_n // ctx.dp
    opts: list[Choice] = []
    if not s.use_dynamic_bsz and s.ppo_micro_batch_size_per_gpu and per_mini:
        for m in _divisors_below(per_mini, int(s.ppo_micro_batch_size_per_gpu)):
            opts.append(ctx.choice(s, {A + "actor.ppo_micro_batch_size_per_gpu": m}))
    if not s.log_prob_use_dynamic_bsz and s.log_prob_micro_batch_size_per_gpu:
        base = opts[-1][0] if opts else {}
        for m in _divisors_below(per_step, int(s.log_prob_micro_batch_size_per_gpu)):
            vals = {**base, A + "rollout.log_prob_micro_batch_size_per_gpu": m}
            if s.ref_used and not s.ref_log_prob_use_dynamic_bsz:
                vals[A + "ref.log_prob_micro_batch_size_per_gpu"] = m
            opts.append(ctx.choice(s, vals))
    return _pick(ctx, s, opts) if opts else "micro-batches are already 1"


def _no_entropy(s: memplan.Settings) -> str:
    return "" if s.entropy_in_update else "no entropy in the loss (entropy_coeff 0)"


def _entropy_compiled(s: memplan.Settings) -> str:
    if not s.entropy_in_update and s.use_torch_compile:
        return "the log-prob pass's entropy is torch.compile'd (fused, no vocabulary-sized copy)"
    return ""


def _no_lora(s: memplan.Settings) -> str:
    return "" if s.lora_rank > 0 else "only with LoRA"


MOVES: tuple[Move, ...] = (
    Move("max_model_len", "vLLM max_model_len = prompt + response", 0, _m_max_model_len),
    Move("free_cache_engine", "free vLLM's KV cache while training", 1, _switch_on(A + "rollout.free_cache_engine")),
    Move("bucket", "smaller weight-sync bucket", 2, _m_bucket),
    Move("grad_ckpt", "gradient checkpointing", 3, _switch_on(A + "model.enable_gradient_checkpointing")),
    Move("token_budget", "smaller token budgets", 4, _m_budget),
    Move("opt_offload", "optimizer offload", 5, _switch_on(A + "actor.fsdp_config.optimizer_offload")),
    Move("param_offload", "parameter offload", 6, _switch_on(A + "actor.fsdp_config.param_offload")),
    Move("util", "rollout gpu_memory_utilization", 7, _m_util),
    Move("tp", "rollout tensor parallel", 8, _m_tp),
    Move("ref_offload", "reference offload", 9, _m_ref_offload),
    Move("micro", "smaller micro-batches", 10, _m_micro),
    Move("entropy_ckpt", "entropy checkpointing", 11, _switch_on(A + "actor.entropy_checkpointing", _no_entropy)),
    Move("entropy_chunk", "entropy in chunks", 12,
         _switch_on(A + "actor.entropy_from_logits_with_chunking", _entropy_compiled)),
    Move("layered_summon", "LoRA weight sync layer by layer", 13, _switch_on(A + "rollout.layered_summon", _no_lora),
         full_ft=False),
)
LORA_RANK = 100

# ---- moves for time, taken after the memory fits: the same algorithm, a shorter step by the time plan ----

def _m_fused(ctx: Judge, s: memplan.Settings) -> list[Choice] | str:
    if s.use_fused_kernels:
        return "already on"
    return [ctx.choice(s, {A + "model.use_fused_kernels": True})]


def padded_why_not(s: memplan.Settings) -> str:
    """Why padded micro-batches are not a move for `s` ("" where they are): they save the attention a packed
    micro-batch spends across its answers without flash-attn (benchmarks/gpu/results/2026-12-06-h100-padded)."""
    if not s.use_remove_padding:
        return "already on"
    if not s.packed_attention:
        return "flash-attn attends within each answer of a packed micro-batch already"
    if s.sp_size > 1:
        return "Ulysses sequence parallelism needs packed micro-batches (use_remove_padding)"
    return ""


def _m_padded(ctx: Judge, s: memplan.Settings) -> list[Choice] | str:
    why = padded_why_not(s)
    if why:
        return why
    key, padded = ctx.choice(s, {A + "model.use_remove_padding": False})
    # padded micro-batches drop the attention that grew with their size: with each larger budget too, as one move
    budgets = _m_larger_budgets(ctx, padded)
    return [(key, padded)] + ([({**key, **vals}, s2) for vals, s2 in budgets] if isinstance(budgets, list) else [])


def _measured_update_tokens() -> float:
    """The largest update micro-batch (tokens) a recorded run measured; no limit without the calibration table."""
    return ((timeplan.table().get("measured_range") or {}).get("update_tokens") or [0, math.inf])[1]


def larger_budgets(budget: int) -> Iterator[int]:
    """The update token budgets make fit tries above `budget`, in order: each power of two above it, no larger than
    the update micro-batches the recorded runs measured (the time plan's saving is fitted there)."""
    measured, t = _measured_update_tokens(), 1 << int(budget).bit_length()
    while t <= measured:
        yield t
        t *= 2


def _m_larger_budgets(ctx: Judge, s: memplan.Settings) -> list[Choice] | str:
    """larger_budgets up to one that holds a whole update per GPU; the log-prob passes' budgets raised to each too
    (never lowered)."""
    if not s.use_dynamic_bsz:
        return "dynamic batch size is off (micro-batch sizes instead)"
    if next(larger_budgets(s.ppo_max_token_len_per_gpu), None) is None:
        return f"no recorded run measured update micro-batches above {_measured_update_tokens()} tokens"
    cap = ctx.tokens_per_gpu_per_update(s)
    opts = [_budgets(ctx, s, t, max(s.log_prob_max_token_len_per_gpu, t), max(s.ref_log_prob_max_token_len_per_gpu, t))
            for t in itertools.takewhile(lambda t: cap and t < 2 * cap, larger_budgets(s.ppo_max_token_len_per_gpu))]
    return opts or f"the budget ({s.ppo_max_token_len_per_gpu}) already holds a whole update ({cap} tokens per GPU)"


SPEED_MOVES = (  # (id, title, options): in this order, each kept when every phase still fits and the step is shorter
    ("fused", "verl's fused log-prob (speed=fused)", _m_fused),
    ("padded", "padded micro-batches (use_remove_padding=false)", _m_padded),
    ("larger_budgets", "larger token budgets", _m_larger_budgets),
)

RANK = ({m.id: m.rank for m in MOVES} | {"lora": LORA_RANK, "tp_fix": -1, "budget_fix": -1}
        | {mid: -1 for mid, _, _ in SPEED_MOVES})
REQUIRED = ("tp_fix", "budget_fix")  # the fit's first moves, not choices: what verl needs to start or to run
BY_ID = {m.id: m for m in MOVES}


def move_title(mid: str) -> str:
    return ({"lora": "LoRA", "tp_fix": "rollout TP that the GPUs allow", "budget_fix": "token budgets of one sequence"}
            | {i: t for i, t, _ in SPEED_MOVES}).get(mid) or BY_ID[mid].title
