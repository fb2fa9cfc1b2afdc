"""Fit: find the settings that make every phase of a config fit its cards, without changing what is trained.

    python run.py preflight.fit=true model=qwen3_4b hardware=rtx4080_16gbx4       # = make fit ARGS="..."
    python run.py preflight.fit_write=my_4b model=qwen3_4b hardware=...           # also saves conf/experiment/my_4b.yaml

One job: search. The memory model is grpo_lab/memory/memplan.py (how close it is, per regime: grpo_lab/memory/calibration.py);
this module only moves the settings a user can change without changing what is trained, in the guide's order of
preference, and keeps the batch arithmetic (prompts per step, answers per prompt, updates per step, prompt and
response lengths) as asked:

  free first:   vLLM's max_model_len = prompt + response, free_cache_engine, a smaller weight-sync bucket
  the guide's:  gradient checkpointing, token budgets (update and log-prob passes), optimizer offload, parameter
                offload, rollout gpu_memory_utilization, rollout TP, reference offload, micro-batch sizes (when
                dynamic batch size is off), entropy checkpointing / chunking where entropy is computed
  last, loudly: LoRA (it changes what is trained), only when no full fine-tuning setting fits

"Fits" means memplan's verdict: every phase below TIGHT_FRACTION (80%) of the card and of host RAM.

The search is small and bounded: every single move and every combination of up to three (applied in the order
above, each move picking its own value given the moves before it), plus a greedy path through all of them with the
moves it did not need pruned afterwards: about 300 evaluations of the plan (~0.2 ms each). The cheapest fitting
combination wins: the one whose most expensive move comes earliest in the order, then the fewest moves. The result
is then re-checked: the overrides are applied to the verl config (`apply_overrides`) and the preflight
(`grpo_lab.checks.preflight.run_preflight`) must pass on it with no error.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import math
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from grpo_lab import facts
from grpo_lab.memory import calibration, engines, memplan
from grpo_lab.cli.apply import apply_overrides, groups as _conf_groups
from grpo_lab.cli.knobs import short_key_targets
from grpo_lab.cli.config import get as _get
from grpo_lab.cli.config import put as _put
from grpo_lab.cli.knobs import KNOBS
from grpo_lab.checks.rules.memory import MEMORY_RULES  # noqa: F401 (the rules the fit is here to clear)

A = "actor_rollout_ref."
CONF = facts.ROOT / "conf"
GB = memplan.GB
MARGIN = memplan.TIGHT_FRACTION
PHASES = ("generation", "training", "weight_sync", "host_ram")
# host <-> device copies per card when lab.hardware.pcie_gb_s is not given (pinned memory, one x16 link per card)
PCIE_GB_S = {"pcie3": 12.0, "pcie4": 25.0, "pcie5": 50.0}
PCIE_DEFAULT = ("pcie4", 25.0)
# LoRA as conf/model/qwen3_8b_lora.yaml sets it; FSDP2: with FSDP1 verl 0.9.1 sends vLLM an empty adapter (peft >= 0.21)
LORA = {A + "model.lora_rank": 64, A + "model.lora_alpha": 32, A + "rollout.load_format": "safetensors",
        A + "actor.strategy": "fsdp2"}
MAX_COMBO = 3


# ---------------------------------------------------------------------------------------------------------------
# evaluating a setting
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Eval:
    peaks: dict[str, float]
    verdicts: dict[str, str]
    overflow: float   # GB above the target, summed over the phases (plus what vLLM's KV cache lacks)

    @property
    def fits(self) -> bool:
        return all(v in ("fits", "unknown") for v in self.verdicts.values())

    @property
    def misses(self) -> int:
        return sum(v not in ("fits", "unknown") for v in self.verdicts.values())

    def score(self) -> tuple[int, float]:
        return self.misses, round(self.overflow, 3)


class Ctx:
    """What the search needs besides the settings: the model, the hardware facts, the batch, a cache of plans."""

    def __init__(self, arch: memplan.Arch, base: memplan.Settings, lab: Mapping[str, Any], *, mini: int = 0,
                 ref_offload: Any = None):
        self.arch = arch
        self.base = base
        self.lab = lab
        self.mini = mini                # actor.ppo_mini_batch_size (prompts)
        self.ref_offload = ref_offload  # ref.fsdp_config.param_offload as configured
        self._cache: dict[Any, Eval] = {}
        self.evaluations = 0
        hw = _get(lab, "hardware", {}) or {}
        link = str(hw.get("interconnect") or "")
        if hw.get("pcie_gb_s"):
            self.bw, self.bw_note = float(hw["pcie_gb_s"]), f"lab.hardware.pcie_gb_s={hw['pcie_gb_s']}"
        elif link in PCIE_GB_S:
            self.bw = PCIE_GB_S[link]
            self.bw_note = f"assumed for {link.upper()} x16 with pinned memory; set lab.hardware.pcie_gb_s to yours"
        else:
            self.bw = PCIE_DEFAULT[1]
            self.bw_note = "assumed (PCIe 4.0 x16, pinned memory); set lab.hardware.pcie_gb_s to yours"
        self.nvlink = bool(hw.get("nvlink"))

    def eval(self, s: memplan.Settings) -> Eval:
        try:
            hit = self._cache.get(s)
        except TypeError:  # unhashable field (a list of LoRA targets): no cache
            hit = None
        if hit is not None:
            return hit
        self.evaluations += 1
        arch, card = self.arch, s.card_gb
        peaks, verdicts, over = {}, {}, 0.0
        for ph in PHASES:
            peak, verdict = memplan.phase_result(arch, s, ph)
            peaks[ph], verdicts[ph] = peak, verdict
            cap = card if ph != "host_ram" else float(s.host_ram_gb or 0)
            if cap:
                over += max(0.0, peak - MARGIN * cap)
        kv = memplan.kv_cache(arch, s)
        if not kv["fits_max_model_len"]:
            over += (kv["max_model_len"] - max(0, kv["tokens"])) * kv["bytes_per_token"] / GB + 0.01
        e = Eval(peaks, verdicts, over)
        try:
            self._cache[s] = e
        except TypeError:
            pass
        return e

    # batch facts for the cost words
    @property
    def dp(self) -> int:
        return max(1, self.base.n_gpus // max(1, self.base.sp_size))

    def tokens_per_gpu_per_update(self, s: memplan.Settings) -> int:
        return self.mini * s.rollout_n * s.seq_len // self.dp


# ---------------------------------------------------------------------------------------------------------------
# moves: each picks its own value given the settings so far, or says why it does not apply
# ---------------------------------------------------------------------------------------------------------------

Choice = tuple[dict[str, Any], memplan.Settings]


@dataclass(frozen=True)
class Move:
    id: str
    title: str
    rank: int
    choose: Callable[[Ctx, memplan.Settings], "Choice | str"]
    full_ft: bool = True   # a move for full fine-tuning and LoRA alike (False: LoRA only)


def _pick(ctx: Ctx, s: memplan.Settings, options: list[Choice]) -> Choice | str:
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


def _m_max_model_len(ctx: Ctx, s: memplan.Settings) -> Choice | str:
    seq = s.seq_len
    mml = memplan.vllm_max_model_len(ctx.arch, s)
    if mml <= seq:
        return f"already {mml} (prompt + response = {seq})"
    return {A + "rollout.max_model_len": seq}, replace(s, max_model_len=seq)


def _m_bucket(ctx: Ctx, s: memplan.Settings) -> Choice | str:
    opts, b = [], s.bucket_mb
    while b > 512:
        b = max(512, b // 2)
        opts.append(({A + "rollout.checkpoint_engine.update_weights_bucket_megabytes": b}, replace(s, bucket_mb=b)))
    return _pick(ctx, s, opts) if opts else f"already {s.bucket_mb} MiB (512 is the floor here)"


def _switch_on(key: str, attr: str) -> Callable[[Ctx, memplan.Settings], Choice | str]:
    """A move that turns one boolean setting on: the verl key, and the planner's Settings field it maps to."""
    def move(ctx: Ctx, s: memplan.Settings) -> Choice | str:
        if getattr(s, attr):
            return "already on"
        return {key: True}, replace(s, **{attr: True})
    return move


def _with_budget(s: memplan.Settings, t: int) -> memplan.Settings:
    seq = s.seq_len
    return replace(s, ppo_max_token_len_per_gpu=t,
                   log_prob_max_token_len_per_gpu=max(seq, min(s.log_prob_max_token_len_per_gpu, 2 * t)),
                   ref_log_prob_max_token_len_per_gpu=max(seq, min(s.ref_log_prob_max_token_len_per_gpu, 2 * t)))


def _m_budget(ctx: Ctx, s: memplan.Settings) -> Choice | str:
    if not s.use_dynamic_bsz:
        return "dynamic batch size is off (micro-batch sizes instead)"
    seq, t = s.seq_len, s.ppo_max_token_len_per_gpu
    opts = []
    while t > seq:
        t = max(seq, t // 2)
        s2 = _with_budget(s, t)
        vals = {A + "actor.ppo_max_token_len_per_gpu": t}
        if s2.log_prob_max_token_len_per_gpu != s.log_prob_max_token_len_per_gpu:
            vals[A + "rollout.log_prob_max_token_len_per_gpu"] = s2.log_prob_max_token_len_per_gpu
        if s2.ref_log_prob_max_token_len_per_gpu != s.ref_log_prob_max_token_len_per_gpu:
            vals[A + "ref.log_prob_max_token_len_per_gpu"] = s2.ref_log_prob_max_token_len_per_gpu
        opts.append((vals, s2))
    return _pick(ctx, s, opts) if opts else f"already one sequence ({seq} tokens): it cannot go lower"


def _m_util(ctx: Ctx, s: memplan.Settings) -> Choice | str:
    u0 = s.gpu_memory_utilization
    valid = 0.0 < u0 < 1.0
    if valid and ctx.eval(s).verdicts["generation"] == "fits" and memplan.kv_cache(ctx.arch, s)["fits_max_model_len"]:
        return f"generation fits at {u0:g}"
    # the highest value whose generation phase fits (most KV cache), else whatever helps most
    opts = [({A + "rollout.gpu_memory_utilization": u}, replace(s, gpu_memory_utilization=u))
            for u in (round(k * 0.05, 2) for k in range(19, 1, -1)) if abs(u - u0) > 1e-6]
    fitting = [o for o in opts if ctx.eval(o[1]).fits]
    if fitting:
        return fitting[0]
    gen_ok = [o for o in opts if ctx.eval(o[1]).verdicts["generation"] == "fits"]
    if gen_ok:
        best = gen_ok[0]
        if not valid or ctx.eval(best[1]).score() < ctx.eval(s).score():
            return best
    return _pick(ctx, s, opts)


def _tp_ok(arch: memplan.Arch, n_gpus: int, tp: int) -> bool:
    kv = arch.num_key_value_heads
    return (n_gpus % tp == 0 and arch.num_attention_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0))


def _m_tp(ctx: Ctx, s: memplan.Settings) -> Choice | str:
    opts, tp = [], s.tp * 2
    while tp <= s.n_gpus:
        if _tp_ok(ctx.arch, s.n_gpus, tp):
            opts.append(({A + "rollout.tensor_model_parallel_size": tp}, replace(s, tp=tp)))
        tp *= 2
    if not opts:
        return f"TP {s.tp} is the most that {s.n_gpus} GPU(s) and {ctx.arch.num_attention_heads} heads allow"
    return _pick(ctx, s, opts)


def _m_ref_offload(ctx: Ctx, s: memplan.Settings) -> Choice | str:
    if not s.ref_used:
        return "no reference model (no KL term)"
    on = ctx.ref_offload
    if on is None or on:
        return "already on (the reference's parameters live in host RAM)"
    # the plan assumes verl streams the reference in per layer either way: no predicted change, so never chosen
    return "the plan already counts the reference in host RAM (verl streams it per layer): no predicted change"


def _divisors_below(n: int, limit: int) -> list[int]:
    return [d for d in range(min(n, limit) - 1, 0, -1) if n % d == 0]


def _m_micro(ctx: Ctx, s: memplan.Settings) -> Choice | str:
    if s.use_dynamic_bsz and s.log_prob_use_dynamic_bsz:
        return "dynamic batch size is on (token budgets instead)"
    per_mini = ctx.tokens_per_gpu_per_update(s) // max(1, s.seq_len)
    per_step = s.train_batch_size * s.rollout_n // ctx.dp
    opts: list[Choice] = []
    if not s.use_dynamic_bsz and s.ppo_micro_batch_size_per_gpu and per_mini:
        for m in _divisors_below(per_mini, int(s.ppo_micro_batch_size_per_gpu)):
            opts.append(({A + "actor.ppo_micro_batch_size_per_gpu": m}, replace(s, ppo_micro_batch_size_per_gpu=m)))
    if not s.log_prob_use_dynamic_bsz and s.log_prob_micro_batch_size_per_gpu:
        base = opts[-1] if opts else ({}, s)
        for m in _divisors_below(per_step, int(s.log_prob_micro_batch_size_per_gpu)):
            vals = {**base[0], A + "rollout.log_prob_micro_batch_size_per_gpu": m}
            s2 = replace(base[1], log_prob_micro_batch_size_per_gpu=m)
            if s.ref_used and not s.ref_log_prob_use_dynamic_bsz:
                vals[A + "ref.log_prob_micro_batch_size_per_gpu"] = m
                s2 = replace(s2, ref_log_prob_micro_batch_size_per_gpu=m)
            opts.append((vals, s2))
    return _pick(ctx, s, opts) if opts else "micro-batches are already 1"


def _m_entropy_ckpt(ctx: Ctx, s: memplan.Settings) -> Choice | str:
    if not s.entropy_in_update:
        return "no entropy in the loss (entropy_coeff 0)"
    if s.entropy_checkpointing:
        return "already on"
    return {A + "actor.entropy_checkpointing": True}, replace(s, entropy_checkpointing=True)


def _m_entropy_chunk(ctx: Ctx, s: memplan.Settings) -> Choice | str:
    if not s.entropy_in_update and s.use_torch_compile:
        return "the log-prob pass's entropy is torch.compile'd (fused, no vocabulary-sized copy)"
    if s.actor_entropy_chunking:
        return "already on"
    return {A + "actor.entropy_from_logits_with_chunking": True}, replace(s, actor_entropy_chunking=True)


def _m_layered(ctx: Ctx, s: memplan.Settings) -> Choice | str:
    if s.lora_rank <= 0:
        return "only with LoRA"
    if s.layered_summon:
        return "already on"
    return {A + "rollout.layered_summon": True}, replace(s, layered_summon=True)


MOVES: tuple[Move, ...] = (
    Move("max_model_len", "vLLM max_model_len = prompt + response", 0, _m_max_model_len),
    Move("free_cache_engine", "free vLLM's KV cache while training", 1,
         _switch_on(A + "rollout.free_cache_engine", "free_cache_engine")),
    Move("bucket", "smaller weight-sync bucket", 2, _m_bucket),
    Move("grad_ckpt", "gradient checkpointing", 3,
         _switch_on(A + "model.enable_gradient_checkpointing", "gradient_checkpointing")),
    Move("token_budget", "smaller token budgets", 4, _m_budget),
    Move("opt_offload", "optimizer offload", 5,
         _switch_on(A + "actor.fsdp_config.optimizer_offload", "optimizer_offload")),
    Move("param_offload", "parameter offload", 6,
         _switch_on(A + "actor.fsdp_config.param_offload", "param_offload")),
    Move("util", "rollout gpu_memory_utilization", 7, _m_util),
    Move("tp", "rollout tensor parallel", 8, _m_tp),
    Move("ref_offload", "reference offload", 9, _m_ref_offload),
    Move("micro", "smaller micro-batches", 10, _m_micro),
    Move("entropy_ckpt", "entropy checkpointing", 11, _m_entropy_ckpt),
    Move("entropy_chunk", "entropy in chunks", 12, _m_entropy_chunk),
    Move("layered_summon", "LoRA weight sync layer by layer", 13, _m_layered, full_ft=False),
)
LORA_RANK = 100


# ---------------------------------------------------------------------------------------------------------------
# the search
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class State:
    s: memplan.Settings
    values: dict[str, Any] = field(default_factory=dict)       # verl key -> value, in the order they were set
    moves: tuple[str, ...] = ()
    lora: bool = False
    # (move id, the values it set, settings before, settings after), in the order applied
    history: tuple[tuple[str, dict[str, Any], memplan.Settings, memplan.Settings], ...] = ()

    def cost(self) -> tuple:
        ranks = sorted((_RANK[m] for m in self.moves if m not in ("max_model_len", "tp_fix")), reverse=True)
        return (self.lora, tuple(ranks), len(self.values))


_RANK = {m.id: m.rank for m in MOVES} | {"lora": LORA_RANK, "tp_fix": -1}
_BY_ID = {m.id: m for m in MOVES}


def _step(ctx: Ctx, st: State, move: Move) -> State | None:
    r = move.choose(ctx, st.s)
    if isinstance(r, str):
        return None
    vals, s2 = r
    moves = st.moves if move.id in st.moves else st.moves + (move.id,)
    return State(s2, {**st.values, **vals}, moves, st.lora, st.history + ((move.id, vals, st.s, s2),))


def _apply_combo(ctx: Ctx, start: State, combo: Iterable[Move]) -> State | None:
    st = start
    for m in sorted(combo, key=lambda m: m.rank):
        st = _step(ctx, st, m)
        if st is None:
            return None
    return st


def _greedy(ctx: Ctx, start: State, moves: list[Move]) -> State:
    """Every move in order that lowers the overflow, up to three passes; then drop the moves it did not need."""
    st = start
    for _ in range(3):
        changed = False
        for m in moves:
            if ctx.eval(st.s).fits:
                break
            nxt = _step(ctx, st, m)
            if nxt is not None and ctx.eval(nxt.s).score() < ctx.eval(st.s).score():
                st, changed = nxt, True
        if not changed or ctx.eval(st.s).fits:
            break
    if not ctx.eval(st.s).fits:
        return st
    used = [_BY_ID[m] for m in st.moves if m in _BY_ID]
    canon = _apply_combo(ctx, start, used)  # the same moves once each, in order: one value per key
    if canon is not None and ctx.eval(canon.s).fits:
        st = canon
    for m in sorted(used, key=lambda m: -m.rank):  # the most expensive first
        rest = [u for u in used if u is not m]
        alt = _apply_combo(ctx, start, rest)
        if alt is not None and ctx.eval(alt.s).fits:
            used, st = rest, alt
    return st


def _search(ctx: Ctx, start: State, *, combos: bool = True) -> tuple[State | None, list[State]]:
    """(cheapest fitting state or None, every fitting state seen): combinations up to MAX_COMBO plus greedy."""
    moves = [m for m in MOVES if m.full_ft or start.s.lora_rank > 0]
    if ctx.eval(start.s).fits:
        return start, [start]
    found: dict[tuple, State] = {}
    if combos:
        usable = [m for m in moves if not isinstance(m.choose(ctx, start.s), str)
                  or m.id in ("util", "micro")]  # util and micro-batches can become useful after other moves
        for k in range(1, MAX_COMBO + 1):
            for combo in itertools.combinations(usable, k):
                st = _apply_combo(ctx, start, combo)
                if st is not None and ctx.eval(st.s).fits:
                    found.setdefault(tuple(sorted(st.values.items(), key=str)), st)
    g = _greedy(ctx, start, moves)
    if ctx.eval(g.s).fits:
        found.setdefault(tuple(sorted(g.values.items(), key=str)), g)
    ranked = sorted(found.values(), key=State.cost)
    return (ranked[0] if ranked else None), ranked


def _lora_start(st: State) -> State:
    s = replace(st.s, lora_rank=LORA[A + "model.lora_rank"], lora_targets=st.s.lora_targets or "all-linear",
                strategy=LORA[A + "actor.strategy"])
    return State(s, {**st.values, **LORA}, st.moves + ("lora",), True, st.history + (("lora", dict(LORA), st.s, s),))


# ---------------------------------------------------------------------------------------------------------------
# when nothing fits: what would
# ---------------------------------------------------------------------------------------------------------------

def _fits_with(ctx: Ctx, s: memplan.Settings, arch: memplan.Arch | None = None) -> State | None:
    c = ctx if arch is None else Ctx(arch, s, ctx.lab, mini=ctx.mini, ref_offload=ctx.ref_offload)
    best, _ = _search(c, State(s), combos=False)
    return best


def _smallest_card(ctx: Ctx, s: memplan.Settings) -> float | None:
    lo, hi = math.floor(s.card_gb), 1024  # whole GB: the smallest size that fits, not a real number rounded up
    if _fits_with(ctx, replace(s, card_gb=float(hi))) is None:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits_with(ctx, replace(s, card_gb=float(mid))) is not None:
            hi = mid
        else:
            lo = mid
    return float(hi)


def _fewest_gpus(ctx: Ctx, s: memplan.Settings, traj: int, mini_traj: int) -> tuple[int | None, int | None]:
    """(fewest GPUs of this card that fit the memory, fewest that fit and split the batch), up to 16x as many."""
    first = None
    for k in range(2, 17):
        n = s.n_gpus * k
        # more nodes bring their own RAM: the plan's host RAM is node-wide, so scale the capacity with the nodes
        ram = s.host_ram_gb * k if s.host_ram_gb else s.host_ram_gb
        if _fits_with(ctx, replace(s, n_gpus=n, host_ram_gb=ram)) is not None:
            first = first or n
            if traj % n == 0 and mini_traj % n == 0:
                return first, n
    return first, None


def _model_options() -> list[tuple[str, dict[str, Any]]]:
    """(option, merged YAML) of every conf/model/*.yaml, following `defaults` inside the model group."""
    def load(name: str, depth: int = 0) -> dict[str, Any]:
        data = yaml.safe_load((CONF / "model" / f"{name}.yaml").read_text()) or {}
        merged: dict[str, Any] = {}
        for d in data.get("defaults") or []:
            if isinstance(d, str) and d != "_self_" and depth < 4:
                merged = _merge(merged, load(d, depth + 1))
        return _merge(merged, {k: v for k, v in data.items() if k != "defaults"})

    out = []
    for p in sorted((CONF / "model").glob("*.yaml")):
        try:
            out.append((p.stem, load(p.stem)))
        except (OSError, yaml.YAMLError):
            continue
    return out


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def way_out(ctx: Ctx, s: memplan.Settings, verl: Mapping[str, Any], *, lora_fits: State | None,
            lora_chosen: bool = False) -> list[str]:
    """What would fit, when these cards cannot: a bigger card, more GPUs, LoRA, a smaller model."""
    lines = []
    what = "full fine-tuning" if s.lora_rank == 0 else "this LoRA setup"
    card = _smallest_card(ctx, s)
    if card is not None:
        lines.append(f"a bigger card: {what} fits (with the changes the fit would add) on cards of {card:g} GB or "
                     f"more, {s.n_gpus} of them (lab.hardware.gpu_memory_gb={card:g}; these are {s.card_gb:g} GB)")
    else:
        lines.append(f"a bigger card: no card up to 1024 GB fits {what} on {s.n_gpus} GPU(s)")
    traj = s.train_batch_size * s.rollout_n
    mini_traj = ctx.mini * s.rollout_n
    first, n = _fewest_gpus(ctx, s, traj, mini_traj)
    per = int(_get(verl, "trainer.n_gpus_per_node", s.n_gpus) or s.n_gpus)
    if n:
        how = f"nnodes={n // per} with {per} each" if n % per == 0 else f"ngpus_per_node={n}"
        lines.append(f"more GPUs: {n} GPUs of {s.card_gb:g} GB ({how}) fit {what}: FSDP shards the actor state over "
                     f"all of them" + (f" ({first} would hold the memory, but the {traj} trajectories per step and "
                                       f"the mini-batch's {mini_traj} do not split over {first})" if first != n else ""))
    elif first:
        lines.append(f"more GPUs: {first} GPUs of {s.card_gb:g} GB would hold {what}, but the {traj} trajectories per "
                     f"step (mini-batch {mini_traj}) must split over them too: change the batch sizes")
    else:
        lines.append(f"more GPUs: not even {s.n_gpus * 16} GPUs of {s.card_gb:g} GB fit {what}")
    if s.lora_rank == 0:
        if lora_fits is not None and lora_chosen:
            pass  # the command above is that LoRA setup
        elif lora_fits is not None:
            lines.append("LoRA (trains adapters, not the whole model): "
                         + " ".join(_override_strs(lora_fits.values, None)))
        else:
            lines.append("LoRA: does not fit either on these cards")
    cur = ctx.arch.params()
    smaller = []
    for name, m in _model_options():
        mm = (m.get("lab") or {}).get("model") or {}
        if not mm.get("hub_id") or any(mm.get(k) is None for k in memplan.Arch.FIELDS):
            continue
        arch = memplan.Arch.from_mapping(mm, source=name)
        if arch.params() >= cur:
            continue
        rank = int(_get(m, A + "model.lora_rank", 0) or 0)
        s2 = replace(s, lora_rank=rank)
        best = _fits_with(ctx, s2, arch)
        if best is not None:
            smaller.append((arch.params(), name, best))
    if smaller:
        smaller.sort(key=lambda x: (-x[0], x[1]))
        p, name, best = smaller[0]
        hw = _get(ctx.lab, "hardware.name")
        lines.append(f"a smaller model: model={name} ({p / 1e9:.1f}B) fits these cards"
                     + (f" (also: {', '.join('model=' + n for _, n, _ in smaller[1:])})" if len(smaller) > 1 else "")
                     + f"; its own command: make fit ARGS=\"model={name}" + (f" hardware={hw}" if hw else "") + '"')
    else:
        lines.append("a smaller model: none of conf/model/ fits these cards either")
    return lines


# ---------------------------------------------------------------------------------------------------------------
# what each change costs, in words and numbers
# ---------------------------------------------------------------------------------------------------------------

def _cost_words(ctx: Ctx, move: str, before: memplan.Settings, after: memplan.Settings) -> str:
    arch = ctx.arch
    if move == "max_model_len":
        return (f"free: vLLM's context becomes prompt + response = {after.seq_len} tokens (it was "
                f"{memplan.vllm_max_model_len(arch, before)}); GRPO never generates past it")
    if move == "free_cache_engine":
        return "vLLM frees its KV cache during training and re-allocates it each step: a second or so per step"
    if move == "bucket":
        return (f"the weight sync copies in buckets of {after.bucket_mb} MiB instead of {before.bucket_mb}: a few "
                f"more, smaller copies per step (tensors larger than the bucket go on their own): negligible")
    if move == "grad_ckpt":
        return ("each layer's forward is recomputed in the backward: about a third more compute in the update")
    if move == "token_budget":
        tok = ctx.tokens_per_gpu_per_update(after)
        t0, t1 = before.ppo_max_token_len_per_gpu, after.ppo_max_token_len_per_gpu
        mb = (f": up to {math.ceil(tok / t1)} micro-batches per update instead of {math.ceil(tok / t0)} "
              f"({tok} tokens per GPU per update)") if tok else ""
        lp = (f"; log-prob passes {before.log_prob_max_token_len_per_gpu} -> {after.log_prob_max_token_len_per_gpu}"
              if before.log_prob_max_token_len_per_gpu != after.log_prob_max_token_len_per_gpu else "")
        return (f"update micro-batches of {t1} tokens instead of {t0}{mb}{lp}: smaller matrix multiplies, a "
                f"somewhat slower update")
    if move in ("opt_offload", "param_offload"):
        st = memplan.actor_state(arch, after)
        if move == "opt_offload":
            per_gpu, trips, what = st.optimizer, 1, "Adam's two moments"
            when = "goes to host RAM after each update and comes back before the next"
        else:
            per_gpu, trips, what = st.params, 3, "the actor's parameters"
            when = ("go to host RAM between phases and come back for the weight sync, the old-log-prob pass and "
                    "the update (about 3 round trips per step)")
        moved = 2 * trips * per_gpu / GB
        secs = moved / ctx.bw
        ram = (memplan.host_ram(arch, after)["total_gb"], memplan.host_ram(arch, before)["total_gb"])
        return (f"about {secs:.1f} s more per step: {what}, {per_gpu / GB:.2f} GB per card, {when}: "
                f"{moved:.1f} GB of host-device traffic per card over PCIe at ~{ctx.bw:g} GB/s ({ctx.bw_note}); "
                f"host RAM {ram[1]} -> {ram[0]} GB")
    if move == "util":
        k0, k1 = memplan.kv_cache(arch, before), memplan.kv_cache(arch, after)
        u0, u1 = before.gpu_memory_utilization, after.gpu_memory_utilization
        verb = "lower" if u1 < u0 else "higher"
        waves = (f", {k0['waves'] or '-'} -> {k1['waves'] or '-'} wave(s) of generation per step")
        return (f"{verb} gpu_memory_utilization {u0:g} -> {u1:g}: vLLM's KV cache from {k0['tokens']} to "
                f"{k1['tokens']} tokens, i.e. {k0['concurrent_sequences']} -> {k1['concurrent_sequences']} "
                f"concurrent sequences of prompt + response ({after.seq_len} tokens){waves}")
    if move == "tp_fix":
        return (f"required, not a choice: a vLLM replica of TP {before.tp} needs {before.tp} GPUs and there are "
                f"{before.n_gpus}; TP {after.tp} gives {after.n_gpus // after.tp} replica(s)")
    if move == "tp":
        r0, r1 = before.n_gpus // before.tp, after.n_gpus // after.tp
        link = "NVLink" if ctx.nvlink else "PCIe"
        k1 = memplan.kv_cache(arch, after)
        return (f"{r1} vLLM replica(s) instead of {r0}, each over {after.tp} cards; every "
                f"generated token waits for all-reduces over {link}; KV cache {k1['tokens']} tokens per replica")
    if move == "micro":
        return (f"micro-batches actor {before.ppo_micro_batch_size_per_gpu} -> {after.ppo_micro_batch_size_per_gpu}, "
                f"log-prob {before.log_prob_micro_batch_size_per_gpu} -> {after.log_prob_micro_batch_size_per_gpu} "
                f"per GPU: more, smaller passes, a somewhat slower step")
    if move == "entropy_ckpt":
        return "the entropy's softmax is recomputed in the backward instead of kept: a little more compute"
    if move == "entropy_chunk":
        return f"the entropy over the {arch.vocab_size}-token vocabulary in chunks of {after.entropy_chunk_size} " \
               f"tokens: a little slower"
    if move == "layered_summon":
        return "the LoRA weight sync gathers one layer at a time instead of the whole model: a slower sync"
    if move == "lora":
        n = arch.lora_params(after.lora_rank, after.lora_targets)
        return (f"CHANGES WHAT IS TRAINED: rank-{after.lora_rank} adapters on every linear layer, "
                f"{n / 1e6:.0f}M trainable parameters ({100 * n / arch.params():.1f}% of {arch.params() / 1e9:.1f}B) "
                f"instead of the whole model; the base stays frozen. Learning differs from full fine-tuning: verl's "
                f"LoRA examples use a larger learning rate (conf/model/qwen3_8b_lora.yaml: actor_lr=3e-6)")
    return ""


# ---------------------------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Change:
    move: str
    title: str
    overrides: list[str]
    cost: str
    reason: str          # one line, for the saved experiment file


@dataclass
class FitResult:
    ok: bool
    lora: bool
    overrides: list[str]               # what to add to the command line
    values: dict[str, Any]             # verl key -> value
    changes: list[Change]
    before: dict[str, Any]             # memplan.memory_plan before / after
    after: dict[str, Any] | None
    rejected: list[str]
    way_out: list[str]
    verified: bool = False
    verify_problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)   # non-memory preflight errors: fix these first
    evaluations: int = 0
    title: str = ""
    card_gb: float = 0.0
    host_ram_gb: float | None = None
    batch: dict[str, Any] = field(default_factory=dict)


def _fmt_value(v: Any) -> str:
    from grpo_lab.cli.overrides import quote

    return quote(v)


def _emit_key(verl_key: str, cfg: Any) -> str:
    """The short key when it feeds this verl key in the composed config (cfg: unresolved DictConfig), else verl's."""
    knob = next((k for k in KNOBS if k.verl_key == verl_key), None)
    if knob is None or short_key_targets(knob.key) != (verl_key,):
        return verl_key
    if cfg is None:
        return knob.key
    try:
        from omegaconf import OmegaConf

        parent, leaf = verl_key.rsplit(".", 1)
        raw = OmegaConf.to_container(OmegaConf.select(cfg, parent), resolve=False)[leaf]
    except Exception:
        return verl_key
    return knob.key if raw == "${" + knob.key + "}" else verl_key


def _override_strs(values: Mapping[str, Any], cfg: Any) -> list[str]:
    return [f"{_emit_key(k, cfg)}={_fmt_value(v)}" for k, v in values.items()]


class FitError(Exception):
    """The fit cannot run on this config (no architecture facts, no card size): the message says why."""


def unmeasured_engine(name: Any) -> str:
    """Why the fit cannot search with this rollout engine (the memory plan has not been measured with it)."""
    from grpo_lab.verl_schema import schema

    names = schema().rollout_servers
    verl = (f"; verl 0.9.1 cannot start it either (it knows {', '.join(sorted(names))})" if names and name not in names
            else "")
    return (f"rollout engine {name!r}: the memory plan has not been measured with it (it knows how "
            f"{' and '.join(engines.ENGINES)} use gpu_memory_utilization){verl}, so there is nothing to search. Pick "
            f"one it knows: actor_rollout_ref.rollout.name=vllm (or rollout=sglang_tp1_mem04)")


def fit(verl: Mapping[str, Any], lab: Mapping[str, Any], *, cfg: Any = None,
        environ: Mapping[str, str] | None = None) -> FitResult:
    """Search the settings that make every phase fit; verify the result with the preflight."""
    from grpo_lab.checks.preflight import run_preflight
    from grpo_lab.checks.rules import Ctx as RuleCtx

    environ = os.environ if environ is None else environ
    lab = copy.deepcopy(dict(lab))
    lab["preflight"] = {**(lab.get("preflight") or {}), "strict": True}
    arch = RuleCtx.of(verl, lab, launching=False, environ=environ).model.arch  # the model the preflight plans
    if arch is None:
        raise FitError("no architecture facts for this model (no local config.json, no lab.model): nothing to plan. "
                       "Pick a model group (model=qwen3_1_7b) or point model_path at a folder with its config.json")
    s0 = memplan.settings_from_verl(verl, lab)
    if str(s0.rollout_engine or "vllm").lower() not in engines.ENGINES:
        raise FitError(unmeasured_engine(s0.rollout_engine))
    if s0.card_gb <= 0:
        raise FitError("lab.hardware.gpu_memory_gb is not set: the fit needs the card's size. Pick a hardware option "
                       "(hardware=rtx4080x4) or set it: lab.hardware.gpu_memory_gb=24")
    ctx = Ctx(arch, s0, lab, mini=int(_get(verl, A + "actor.ppo_mini_batch_size", 0) or 0),
              ref_offload=_get(verl, A + "ref.fsdp_config.param_offload"))
    base_report = run_preflight(copy.deepcopy(dict(verl)), copy.deepcopy(lab), launching=False, environ=environ)
    blocked = [f"[{p.rule}] {p.message}" + (f"\n      fix: {p.fix}" if p.fix else "")
               for p in base_report.errors if p.rule not in MEMORY_RULES]
    valid_util = 0.0 < s0.gpu_memory_utilization < 1.0
    before = memplan.memory_plan(arch, s0 if valid_util else replace(s0, gpu_memory_utilization=0.4), remedies=False)
    res = FitResult(ok=False, lora=False, overrides=[], values={}, changes=[], before=before, after=None, rejected=[],
                    way_out=[], blocked=blocked, title=base_report.title, card_gb=s0.card_gb,
                    host_ram_gb=s0.host_ram_gb, batch=_batch_facts(base_report.batch))
    if blocked:
        return res

    start = State(s0)
    if s0.n_gpus % s0.tp or s0.tp > s0.n_gpus:  # a vLLM replica must fit the GPUs: the largest TP that does
        tp = max(t for t in (1, 2, 4, 8) if t <= min(s0.tp, s0.n_gpus) and _tp_ok(arch, s0.n_gpus, t))
        s1 = replace(s0, tp=tp)
        start = State(s1, {A + "rollout.tensor_model_parallel_size": tp}, ("tp_fix",), False,
                      (("tp_fix", {A + "rollout.tensor_model_parallel_size": tp}, s0, s1),))
    best, found = _search(ctx, start)
    lora_best = None
    if best is None and s0.lora_rank == 0:
        lora_best, lfound = _search(ctx, _lora_start(start))
        found = lfound
    chosen = best or lora_best
    if chosen is None or (best is None and lora_best is not None):
        # full fine-tuning (or this LoRA setup) cannot fit: say what would
        res.way_out = way_out(ctx, s0, verl, lora_fits=lora_best, lora_chosen=chosen is lora_best)
    res.rejected = _rejected(ctx, start, chosen, found)
    res.evaluations = ctx.evaluations
    if chosen is None:
        return res

    res.ok, res.lora, res.values = True, chosen.lora, dict(chosen.values)
    res.after = memplan.memory_plan(arch, chosen.s, remedies=False)
    res.changes = _changes(ctx, chosen, cfg)
    res.overrides = [o for c in res.changes for o in c.overrides]
    # verify: the overrides on the verl config, the plan's settings from it, and the whole preflight on it
    v2, l2 = apply_overrides(verl, lab, chosen.values)
    s2 = memplan.settings_from_verl(v2, l2)
    if s2 != chosen.s:
        diff = [f.name for f in s2.__dataclass_fields__.values() if getattr(s2, f.name) != getattr(chosen.s, f.name)]
        res.verify_problems.append(f"the overrides do not give the settings the search planned ({', '.join(diff)})")
    report = run_preflight(v2, l2, launching=False, environ=environ)
    res.verify_problems += [f"[{p.rule}] {p.message}" for p in report.errors]
    res.warnings = [f"[{p.rule}]" for p in report.warnings]
    after_batch = _batch_facts(report.batch)
    if after_batch != res.batch:
        res.verify_problems.append(f"the batch arithmetic changed: {res.batch} -> {after_batch}")
    res.verified = not res.verify_problems
    res.ok = res.verified
    return res


def _batch_facts(b: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("train_batch_size", "rollout_n", "ppo_mini_batch_size", "updates_per_step", "sequence_length",
            "trajectories_per_step")
    return {k: b.get(k) for k in keys}


def _changes(ctx: Ctx, chosen: State, cfg: Any) -> list[Change]:
    """Each move of the chosen state in the order applied, with its overrides, its cost and a one-line reason."""
    later: set[str] = set()
    out = []
    for mid, vals, s_before, s_after in reversed(chosen.history):  # a key set twice keeps its last value only
        keep = {k: v for k, v in vals.items() if k not in later}
        later |= set(vals)
        if not keep:
            continue
        e0, e1 = ctx.eval(s_before), ctx.eval(s_after)
        title = _title(mid)
        lowered = [f"{ph.replace('_', ' ')} {e0.peaks[ph]:g} -> {e1.peaks[ph]:g} GB" for ph in PHASES
                   if abs(e0.peaks[ph] - e1.peaks[ph]) >= 0.01]
        reason = f"{title}: " + (", ".join(lowered) if lowered else "lets vLLM start (room for its KV cache)")
        out.append(Change(mid, title, _override_strs(keep, cfg), _cost_words(ctx, mid, s_before, s_after), reason))
    return out[::-1]


def _rejected(ctx: Ctx, start: State, chosen: State | None, found: list[State]) -> list[str]:
    """Why each move the chosen command does not use was left out."""
    out = []
    used = set(chosen.moves) if chosen else set()
    top = max((_RANK[m] for m in used if m not in ("max_model_len", "tp_fix")), default=-1)
    e0 = ctx.eval(start.s)
    missing = [ph for ph in PHASES if e0.verdicts[ph] not in ("fits", "unknown")]
    for m in MOVES:
        if m.id in used:
            continue
        r = m.choose(ctx, start.s)
        alt = next((f for f in found if m.id in f.moves and f is not chosen), None)
        if alt is not None:
            names = " + ".join(_title(x) for x in alt.moves)
            worst = max(alt.moves, key=lambda x: _RANK[x])
            why = (f"uses {_title(worst)}, later in the guide's order" if _RANK[worst] > top
                   else "needs more changes")
            out.append(f"{m.title}: also fits as {names}; not taken: {why}")
        elif isinstance(r, str):
            out.append(f"{m.title}: {r}")
        elif chosen is not None:
            out.append(f"{m.title}: not needed")
        else:
            e1 = ctx.eval(r[1])
            effect = ", ".join(f"{ph.replace('_', ' ')} {e0.peaks[ph]:g} -> {e1.peaks[ph]:g} GB" for ph in missing
                               if abs(e0.peaks[ph] - e1.peaks[ph]) >= 0.01)
            out.append(f"{m.title}: not enough" + (f" ({effect})" if effect else
                                                   " (no effect on the phases that do not fit)"))
    if chosen is not None and not chosen.lora and start.s.lora_rank == 0:
        out.append("LoRA: not needed, full fine-tuning fits (LoRA would change what is trained)")
    return out


def _title(mid: str) -> str:
    return {"lora": "LoRA", "tp_fix": "rollout TP that the GPUs allow"}.get(mid) or _BY_ID[mid].title


# ---------------------------------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------------------------------

def _pct(peak: float, cap: float | None) -> str:
    return f"{100 * peak / cap:.0f}%" if cap else "-"


def phase_table(res: FitResult) -> list[str]:
    card, ram = res.card_gb, res.host_ram_gb
    b, a = res.before, res.after
    lines = [f"  {'phase':<12} {'before':>16}   {'after':>16}  {'of the card':>11}"]
    for ph in ("generation", "training", "weight_sync"):
        p0, v0 = b["phases"][ph]["peak_gb_per_gpu"], b["verdict"][ph]
        after = ""
        if a:
            p1, v1 = a["phases"][ph]["peak_gb_per_gpu"], a["verdict"][ph]
            after = f"{p1:>8.2f} GB {v1:<5} {_pct(p1, card):>11}"
        lines.append(f"  {ph.replace('_', ' '):<12} {p0:>8.2f} GB {v0:<5} -> {after}")
    h0 = b["host_ram"]
    h1 = a["host_ram"] if a else None
    lines.append(f"  {'host RAM':<12} {h0['total_gb']:>8.2f} GB {h0['verdict']:<5} -> "
                 + (f"{h1['total_gb']:>8.2f} GB {h1['verdict']:<5} {_pct(h1['total_gb'], ram):>11}" if h1 else "")
                 + (f"  (of {ram:g} GB)" if ram else ""))
    k0, k1 = b["kv_cache"], (a["kv_cache"] if a else None)
    kv = f"  vLLM KV cache {k0['tokens']} tokens ({k0['concurrent_sequences']} sequences at once)"
    if k1:
        kv += f" -> {k1['tokens']} tokens ({k1['concurrent_sequences']} sequences at once of {k1['sequence_length']})"
    lines.append(kv)
    return lines


def format_result(res: FitResult, command: str | None) -> str:
    out = [f"grpo-lab fit: {res.title}"]
    card = res.card_gb
    out.append(f"target: every phase below {int(MARGIN * 100)}% of a {card:g} GB card ({MARGIN * card:.1f} GB) and of "
               f"host RAM")
    regime = (((res.after or res.before or {}).get("calibration") or {}).get("training") or {}).get("regime")
    if regime:
        out.extend(f"plan vs recorded runs: {line}" for line in calibration.accuracy_lines(regime))
    if res.blocked:
        out.append("")
        out.append("The preflight finds problems the fit does not touch (it changes memory settings only); fix "
                   "these first:")
        out.extend(f"  {b}" for b in res.blocked)
        return "\n".join(out)
    b = res.batch
    if b.get("train_batch_size"):
        out.append(f"kept as asked: {b['train_batch_size']} prompts x {b['rollout_n']} answers per step, mini-batch "
                   f"{b['ppo_mini_batch_size']} ({b['updates_per_step']} update(s) per step), "
                   f"{b['sequence_length']} tokens of prompt + response")
    if res.lora:
        out.append("")
        out.append("!!! LoRA: full fine-tuning does not fit these cards with any setting tried; this command trains "
                   "LoRA adapters instead: WHAT IS TRAINED CHANGES !!!")
    if res.way_out:
        out.append("")
        out.append("What would fit " + ("full fine-tuning:" if res.lora else "(nothing tried fits these cards):"))
        out.extend(f"  - {w}" for w in res.way_out)
    out.append("")
    out.append("Predicted peak per GPU")
    out.extend(phase_table(res))
    if res.ok or res.after:
        out.append("")
        if res.changes:
            out.append("Changes, in the guide's order of preference, and what each costs")
            for i, c in enumerate(res.changes, 1):
                out.append(f"  {i}. {' '.join(c.overrides)}")
                out.append(f"     {c.title}: {c.cost}")
        else:
            out.append("No change needed: every phase already fits.")
    if res.rejected:
        out.append("")
        out.append("Not taken")
        out.extend(f"  - {r}" for r in res.rejected)
    out.append("")
    if res.verified:
        out.append("checked: the preflight passes on the fitted config (0 errors"
                   + (f"; warnings: {' '.join(res.warnings)}" if res.warnings else "") + ")")
    elif res.after is not None:
        out.append("NOT CHECKED OK: the fitted config does not pass the preflight, so no command is given:")
        out.extend(f"  {p}" for p in res.verify_problems)
    out.append(f"({res.evaluations} plans evaluated)")
    if res.ok and command:
        out.append("")
        out.append("The command:")
        out.append(f"  {command}")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------
# the command line and the saved experiment
# ---------------------------------------------------------------------------------------------------------------

_FIT_KEYS = ("preflight.fit", "preflight.fit_write", "preflight.fit_overwrite")


def _user_args(args: list[str]) -> list[str]:
    return [a for a in args if a.split("=")[0].lstrip("+~") not in _FIT_KEYS]


def fitted_args(args: list[str], overrides: list[str]) -> list[str]:
    """The user's args (less the fit's own keys, less those the fit sets again) followed by the fit's overrides."""
    new = {o.split("=")[0] for o in overrides}
    kept = [a for a in _user_args(args) if a.split("=")[0].lstrip("+~") not in new]
    return kept + list(overrides)


def command_line(args: list[str]) -> str:
    return "python run.py " + " ".join(shlex.quote(a) for a in args)


def experiment_yaml(name: str, args: list[str], res: FitResult, *, made_by: str,
                    today: str | None = None) -> str:
    """conf/experiment/<name>.yaml: header, the user's group choices as `override /group`, their values, the fit's."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups = _conf_groups()
    parsed = OverridesParser.create().parse_overrides(_user_args(args))
    defaults, user_vals = [], {}
    for o in parsed:
        key = o.key_or_group
        if o.is_delete():
            raise ValueError(f"{o.input_line} deletes a key: a config file cannot say that; keep it on the command "
                             f"line: python run.py experiment={name} {o.input_line}")
        if key.startswith("hydra.") or key.startswith("preflight."):
            continue
        if key in groups:
            if key == "experiment":
                defaults.insert(0, f"  - {o.value()}")
            else:
                defaults.append(f"  - override /{key}: {o.value()}")
        else:
            user_vals[key] = o.value()
    today = today or dt.date.today().isoformat()
    a = res.after or {}
    lines = ["# @package _global_",
             f"# Fitted by grpo_lab/checks/fit.py on {today}: every phase below {int(MARGIN * 100)}% of the "
             f"{res.card_gb:g} GB cards ({res.title}).",
             f"#   python run.py experiment={name}",
             f"# made with: {made_by}",
             "# predicted peak per GPU (grpo_lab/memory/memplan.py), before -> after:"]
    for ph in ("generation", "training", "weight_sync"):
        lines.append(f"#   {ph.replace('_', ' ')}: {res.before['phases'][ph]['peak_gb_per_gpu']} GB "
                     f"{res.before['verdict'][ph]} -> {a['phases'][ph]['peak_gb_per_gpu']} GB {a['verdict'][ph]}")
    lines.append(f"#   host RAM: {res.before['host_ram']['total_gb']} GB -> {a['host_ram']['total_gb']} GB")
    if res.lora:
        lines.append("# LoRA: full fine-tuning does not fit these cards; this trains adapters (what is trained changes)")
    lines += ["defaults:", *defaults, "  - _self_", ""]
    tree: dict[str, Any] = {}
    comments: dict[str, str] = {}
    for k, v in user_vals.items():
        _put(tree, k, v)
        comments[k] = "from the command line"
    for c in res.changes:
        for i, o in enumerate(c.overrides):
            k, v = o.split("=", 1)
            _put(tree, k, yaml.safe_load(v))
            comments[k] = c.reason if i == 0 else f"{c.title}, with {c.overrides[0].split('=')[0]}"
    lines += _emit_tree(tree, comments, "", 0)
    return "\n".join(lines) + "\n"


def _emit_tree(tree: dict[str, Any], comments: dict[str, str], prefix: str, depth: int) -> list[str]:
    out = []
    pad = "  " * depth
    for k, v in tree.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and path not in comments:
            out.append(f"{pad}{k}:")
            out += _emit_tree(v, comments, path + ".", depth + 1)
            continue
        if path in comments:
            out.append(f"{pad}# {comments[path]}")
        dumped = yaml.safe_dump({k: v}, default_flow_style=True, width=10_000).strip()
        out.append(pad + dumped[1:-1] if dumped.startswith("{") else pad + dumped)
    return out


def experiment_path(name: Any, *, overwrite: bool) -> Path:
    """conf/experiment/<name>.yaml, after checking the name and that it may be written."""
    name = str(name)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name or ""):
        raise ValueError(f"preflight.fit_write={name!r}: a name of letters, digits, '_' and '-' (it becomes "
                         f"conf/experiment/<name>.yaml), e.g. preflight.fit_write=my_4b_fit")
    path = CONF / "experiment" / f"{name}.yaml"
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists: pick another name, or replace it with preflight.fit_overwrite=true "
                              f"(make fit ... WRITE={name} OVERWRITE=1)")
    return path


def write_experiment(name: str, text: str, *, overwrite: bool) -> Path:
    """Write conf/experiment/<name>.yaml atomically (a temporary file beside it, then a rename)."""
    path = experiment_path(name, overwrite=overwrite)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def fit_job(cfg: Any, verl: dict[str, Any], lab: dict[str, Any], job_dir: Path) -> str:
    """The `preflight.fit=true` branch of a job (grpo_lab/launch/job.py): search, print, maybe save; never launches."""
    from hydra.core.hydra_config import HydraConfig

    from grpo_lab.errors import GrpoLabError
    from grpo_lab.facts import write_json

    args = list(HydraConfig.get().overrides.task)
    pf = lab.get("preflight") or {}
    name = pf.get("fit_write")
    if name:  # a bad name or an existing file: refuse before searching, nothing written
        try:
            experiment_path(name, overwrite=bool(pf.get("fit_overwrite")))
        except (ValueError, FileExistsError) as e:
            raise GrpoLabError(f"fit: {e}") from None
    try:
        res = fit(verl, lab, cfg=cfg)
    except FitError as e:
        raise GrpoLabError(f"fit: {e}") from None
    final = fitted_args(args, res.overrides)
    cmd = command_line(final)
    print(format_result(res, cmd))
    write_json(job_dir / "fit.json", {"ok": res.ok, "lora": res.lora, "overrides": res.overrides,
                                       "command": cmd if res.ok else None, "before": res.before, "after": res.after,
                                       "way_out": res.way_out, "rejected": res.rejected,
                                       "verify_problems": res.verify_problems, "blocked": res.blocked})
    if res.blocked:
        raise GrpoLabError(f"fit: {len(res.blocked)} problem(s) above are not about memory; fix them first "
                           f"(nothing was written or started).")
    if not res.ok:
        if res.after is not None:
            raise GrpoLabError("fit: the fitted config did not pass the preflight (above); no command is given.")
        raise GrpoLabError("fit: nothing tried fits these cards; what would is listed above under 'What would fit'.")
    if name:
        made_by = command_line([a for a in args])
        try:
            text = experiment_yaml(str(name), args, res, made_by=made_by)
            path = write_experiment(str(name), text, overwrite=bool(pf.get("fit_overwrite")))
        except (ValueError, FileExistsError) as e:
            raise GrpoLabError(f"fit: not saved: {e}") from None
        print(f"\nsaved: {path.relative_to(CONF.parent)}; run it with: python run.py experiment={name}")
    else:
        print("\nsave it as conf/experiment/<name>.yaml: add preflight.fit_write=<name> (make fit ARGS=\"...\" "
              "WRITE=<name>)")
    return "fitted"
