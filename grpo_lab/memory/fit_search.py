"""The fit's search: how one setting is judged (`FitContext.eval`: every phase's peak and verdict from the memory plan,
and by how much it misses its target; `FitContext.time`: the time plan); combinations of up to MAX_COMBO moves
(grpo_lab/memory/fit_moves.py) plus a greedy path with the moves it did not need pruned, the cheapest fitting state
first (`search`); LoRA as the start of a second search; and, when nothing fits these cards, what would (`way_out`: a
bigger card, more GPUs, LoRA, a smaller model of conf/model/).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from grpo_lab import facts
from grpo_lab.labconf import Lab
from grpo_lab.memory import memplan, timeplan
from grpo_lab.memory import memplan_remedies as remedies
from grpo_lab.memory.fit_moves import BY_ID, GB, MARGIN, MOVES, PHASES, RANK, REQUIRED, SPEED_MOVES, Eval, Move, tp_ok
from grpo_lab.memory.settings import settings_after, spelled
from grpo_lab.memory.verl_view import VerlView
from grpo_lab.progress import progress
from grpo_lab.verl_keys import A

# LoRA as conf/model/qwen3_8b_lora.yaml sets it, on FSDP2 (memory/memplan_remedies.py: the remedies' LoRA)
LORA = remedies.LORA | remedies.FSDP2
MAX_COMBO = 3


# ---- the search ----

class FitContext:
    """What the search needs besides the settings: the model, the hardware facts, the batch, a cache of plans."""

    def __init__(self, arch: memplan.Arch, base: memplan.Settings, lab: Lab, *, mini: int = 0,
                 ref_offload: Any = None, shape: timeplan.RunShape | None = None):
        self.arch = arch
        self.base = base
        self.lab = lab
        self.mini = mini                # actor.ppo_mini_batch_size (prompts)
        self.ref_offload = ref_offload  # ref.fsdp_config.param_offload as configured
        self._cache: dict[Any, Eval] = {}
        self.evaluations = 0
        hw = lab.hardware
        self.bw, self.bw_note = timeplan.pcie_gb_s(hw)  # host <-> card GB/s per card, for offload's copies
        self.nvlink = bool(hw.nvlink)
        self.card, self.shape = timeplan.Card.of(hw), shape  # the time plan's card and run (the job's Run's)
        self._steps: dict[str, float] = {}

    def eval(self, s: memplan.Settings) -> Eval:
        hit = None
        with contextlib.suppress(TypeError):  # unhashable field (a list of LoRA targets): no cache
            hit = self._cache.get(s)
        if hit is not None:
            return hit
        self.evaluations += 1
        arch, card = self.arch, s.card_gb
        plan, judged = memplan.assess(arch, s)
        peaks = {ph: plan.peak_gb(ph) for ph in PHASES}
        verdicts, over = {ph: judged[ph] for ph in PHASES}, 0.0
        for ph, peak in peaks.items():
            cap = card if ph != "host_ram" else float(s.host_ram_gb or 0)
            if cap:
                over += max(0.0, peak - MARGIN * cap)
        kv = plan.kv
        if not kv["fits_max_model_len"]:
            over += (kv["max_model_len"] - max(0, kv["tokens"])) * kv["bytes_per_token"] / GB + 0.01
        e = Eval(peaks, verdicts, over, kv)
        with contextlib.suppress(TypeError):
            self._cache[s] = e
        return e

    def plan(self, s: memplan.Settings) -> dict[str, Any]:
        """The memory plan of these settings (plan.json's `memory`, without remedies)."""
        return memplan.memory_plan(self.arch, s, remedies=False)

    def time(self, s: memplan.Settings) -> dict[str, Any]:
        """The time plan of these settings (plan.json's `time`)."""
        assert self.shape is not None, "a FitContext without the run's shape plans no time"
        return timeplan.time_plan(self.arch, s, self.card, self.shape, self.eval(s).kv)

    def step_s(self, s: memplan.Settings) -> float:
        """A steady step of these settings by the time plan (seconds), planned once per settings."""
        if repr(s) not in self._steps:
            self._steps[repr(s)] = self.time(s)["step_s"]
        return self._steps[repr(s)]

    def choice(self, s: memplan.Settings, values: dict[str, Any]) -> tuple[dict[str, Any], memplan.Settings]:
        """Values and the settings after them, as the config with them would read (settings_after)."""
        return values, settings_after(s, values, self.lab.set_apart)

    # batch facts for the cost words
    @property
    def dp(self) -> int:
        return max(1, self.base.n_gpus // max(1, self.base.sp_size))

    def tokens_per_gpu_per_update(self, s: memplan.Settings) -> int:
        return self.mini * s.rollout_n * s.seq_len // self.dp



@dataclass
class State:
    s: memplan.Settings
    e: Eval                    # how its settings are judged (every phase's peak and verdict)
    values: dict[str, Any] = field(default_factory=dict)       # verl key -> value, in the order they were set
    moves: tuple[str, ...] = ()
    lora: bool = False
    # (move id, the values it set, settings before, settings after), in the order applied
    history: tuple[tuple[str, dict[str, Any], memplan.Settings, memplan.Settings], ...] = ()

    @property
    def fits(self) -> bool:
        return self.e.fits

    def cost(self) -> tuple:
        ranks = sorted((RANK[m] for m in self.moves if m not in ("max_model_len", *REQUIRED)), reverse=True)
        return (self.lora, tuple(ranks), len(self.values))


def _step(ctx: FitContext, st: State, move: Move) -> State | None:
    r = move.choose(ctx, st.s)
    return None if isinstance(r, str) else _then(ctx, st, move.id, *r)


def _apply_combo(ctx: FitContext, start: State, combo: Iterable[Move]) -> State | None:
    st = start
    for m in sorted(combo, key=lambda m: m.rank):
        st = _step(ctx, st, m)
        if st is None:
            return None
    return st


def _greedy(ctx: FitContext, start: State, moves: list[Move]) -> State:
    """Every move in order that lowers the overflow, up to three passes; then drop the moves it did not need."""
    st = start
    for _ in range(3):
        changed = False
        for m in moves:
            if st.fits:
                break
            nxt = _step(ctx, st, m)
            if nxt is not None and nxt.e.score() < st.e.score():
                st, changed = nxt, True
        if not changed or st.fits:
            break
    if not st.fits:
        return st
    used = [BY_ID[m] for m in st.moves if m in BY_ID]
    canon = _apply_combo(ctx, start, used)  # the same moves once each, in order: one value per key
    if canon is not None and canon.fits:
        st = canon
    for m in sorted(used, key=lambda m: -m.rank):  # the most expensive first
        rest = [u for u in used if u is not m]
        alt = _apply_combo(ctx, start, rest)
        if alt is not None and alt.fits:
            used, st = rest, alt
    return st


def search(ctx: FitContext, start: State, *, combos: bool = True) -> tuple[State | None, list[State]]:
    """(cheapest fitting state or None, every fitting state seen): combinations up to MAX_COMBO plus greedy."""
    moves = [m for m in MOVES if m.full_ft or start.s.lora_rank > 0]
    if start.fits:
        return start, [start]
    found: dict[tuple, State] = {}
    if combos:
        usable = [m for m in moves if not isinstance(m.choose(ctx, start.s), str)
                  or m.id in ("util", "micro")]  # util and micro-batches can become useful after other moves
        tried = [c for k in range(1, MAX_COMBO + 1) for c in itertools.combinations(usable, k)]
        for combo in progress(tried, "searching settings that fit", unit="combinations"):
            st = _apply_combo(ctx, start, combo)
            if st is not None and st.fits:
                found.setdefault(tuple(sorted(st.values.items(), key=str)), st)
    g = _greedy(ctx, start, moves)
    if g.fits:
        found.setdefault(tuple(sorted(g.values.items(), key=str)), g)
    ranked = sorted(found.values(), key=State.cost)
    return (ranked[0] if ranked else None), ranked


@dataclass
class Found:
    """What the search found: where it started, every fitting state, and the pick of each kind."""

    start: State
    states: list[State]  # every fitting state seen (LoRA's, when full fine-tuning found none)
    best: State | None  # full fine-tuning's pick
    lora_best: State | None  # LoRA's, searched only when full fine-tuning does not fit
    faster_than: int = 0  # the other fitting states of the pick's kind, all slower by the time plan
    guide_first: State | None = None  # the guide's first choice, where the time plan finds it slower

    @property
    def chosen(self) -> State | None:
        return self.best or self.lora_best


def start_state(ctx: FitContext, budgets: dict[str, int]) -> State:
    """The search's start: the config, with token budgets raised to one sequence and a TP that fits the GPUs."""
    s0 = ctx.base
    start = State(s0, ctx.eval(s0))
    if budgets:
        start = _then(ctx, start, "budget_fix", *ctx.choice(s0, budgets))
    if s0.n_gpus % s0.tp or s0.tp > s0.n_gpus:  # a vLLM replica must fit the GPUs: the largest TP that does
        tp = max(t for t in (1, 2, 4, 8) if t <= min(s0.tp, s0.n_gpus) and tp_ok(ctx.arch, s0.n_gpus, t))
        start = _then(ctx, start, "tp_fix", *ctx.choice(start.s, {A + "rollout.tensor_model_parallel_size": tp}))
    return start


def _then(ctx: FitContext, st: State, mid: str, vals: dict[str, Any], s2: memplan.Settings,
          lora: bool | None = None) -> State:
    """The state after a move's values (`s2`: the settings after them), judged."""
    moves = st.moves if mid in st.moves else st.moves + (mid,)
    return State(s2, ctx.eval(s2), {**st.values, **vals}, moves, st.lora if lora is None else lora,
                 st.history + ((mid, vals, st.s, s2),))


def choose(ctx: FitContext, budgets: dict[str, int], by: float) -> Found:
    """Search full fine-tuning, then LoRA if that finds nothing; of the fitting states of the kind found, the one
    earliest in the guide's order among those within `by` (a fraction) of the fastest by the time plan."""
    start = start_state(ctx, budgets)
    best, states = search(ctx, start)
    lora_best = None
    if best is None and ctx.base.lora_rank == 0:
        lora_best, states = search(ctx, _then(ctx, start, "lora", *ctx.choice(start.s, dict(LORA)), lora=True))
    out = Found(start, states, best, lora_best)
    fitting = [f for f in states if f.lora == (best is None)]  # the fastest of the same kind (LoRA only when needed)
    if len(fitting) > 1:
        quickest = min(ctx.step_s(st.s) for st in fitting)  # the guide's order among those within `by` of it
        fastest = min((st for st in fitting if ctx.step_s(st.s) <= quickest * (1 + by)), key=State.cost)
        out.best, out.lora_best = (fastest, None) if best is not None else (None, fastest)
        out.faster_than = len(fitting) - 1
        first = min(fitting, key=State.cost)
        if first is not fastest:  # the guide's first choice, slower by the time plan
            out.guide_first = first
    return out


def faster(ctx: FitContext, st: State, by: float, skip: dict[str, str] | None = None) -> tuple[State, list[str]]:
    """The fitting state made quicker: each of SPEED_MOVES in turn, its option with the shortest planned step (to the
    whole second; the least change among equals: options come in that order) among those where every phase still fits,
    kept when that step is at least `by` (a fraction) shorter than before. Also why each move left out was (`skip`:
    move id -> why it is not tried)."""
    why = []
    for mid, title, options in SPEED_MOVES:
        opts = skip[mid] if mid in (skip or {}) else options(ctx, st.s)
        if isinstance(opts, str):  # why the move is left out
            why.append(f"{title}: {opts}")
            continue
        fitting = [(vals, s2) for vals, s2 in opts if ctx.eval(s2).fits]
        if not fitting:
            why.append(f"{title}: no option of it fits every phase")
            continue
        vals, s2 = min(fitting, key=lambda o: round(ctx.step_s(o[1])))
        if ctx.step_s(s2) <= ctx.step_s(st.s) * (1 - by):
            st = _then(ctx, st, mid, vals, s2)
        else:
            why.append(f"{title}: a step {ctx.step_s(st.s):.0f} -> {ctx.step_s(s2):.0f} s by the time plan, less than "
                       f"{by:.0%} shorter")
    return st, why


# ---- when nothing fits: what would ----

def fits_with(ctx: FitContext, s: memplan.Settings, arch: memplan.Arch | None = None) -> State | None:
    c = ctx if arch is None else FitContext(arch, s, ctx.lab, mini=ctx.mini, ref_offload=ctx.ref_offload,
                                            shape=ctx.shape)
    return search(c, State(s, c.eval(s)), combos=False)[0]


def _smallest_card(ctx: FitContext, s: memplan.Settings) -> float | None:
    lo, hi = math.floor(s.card_gb), 1024  # whole GB: the smallest size that fits, not a real number rounded up
    if fits_with(ctx, replace(s, card_gb=float(hi))) is None:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits_with(ctx, replace(s, card_gb=float(mid))) is not None else (mid, hi)
    return float(hi)


def _fewest_gpus(ctx: FitContext, s: memplan.Settings, traj: int, mini_traj: int) -> tuple[int | None, int | None]:
    """(fewest GPUs of this card that fit the memory, fewest that fit and split the batch), up to 16x as many."""
    first = None
    for k in range(2, 17):
        n = s.n_gpus * k
        # more nodes bring their own RAM: the plan's host RAM is node-wide, so scale the capacity with the nodes
        ram = s.host_ram_gb * k if s.host_ram_gb else s.host_ram_gb
        if fits_with(ctx, replace(s, n_gpus=n, host_ram_gb=ram)) is not None:
            first = first or n
            if traj % n == 0 and mini_traj % n == 0:
                return first, n
    return first, None


def way_out(ctx: FitContext, s: memplan.Settings, cfg: VerlView, *, lora_fits: State | None,
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
    per = int(cfg.trainer.n_gpus_per_node or s.n_gpus)
    if n:
        how = f"nnodes={n // per} with {per} each" if n % per == 0 else f"ngpus_per_node={n}"
        lines.append(f"more GPUs: {n} GPUs of {s.card_gb:g} GB ({how}) fit {what}: FSDP shards the actor state over "
                     f"all of them" + (f" ({first} would hold the memory, but the {traj} trajectories per step and "
                                       f"the mini-batch's {mini_traj} do not split over {first})"
                                       if first != n else ""))
    elif first:
        lines.append(f"more GPUs: {first} GPUs of {s.card_gb:g} GB would hold {what}, but the {traj} trajectories per "
                     f"step (mini-batch {mini_traj}) must split over them too: change the batch sizes")
    else:
        lines.append(f"more GPUs: not even {s.n_gpus * 16} GPUs of {s.card_gb:g} GB fit {what}")
    if s.lora_rank == 0 and lora_fits is None:
        lines.append("LoRA: does not fit either on these cards")
    elif s.lora_rank == 0 and not lora_chosen:  # when chosen, the command above is that LoRA setup
        lines.append("LoRA (trains adapters, not the whole model): "
                     + " ".join(c.override for c in spelled(lora_fits.values, None)))
    cur = ctx.arch.params
    smaller = []
    for name, m in facts.conf_options("model").items():
        mm = asdict(Lab.of(m.get("lab")).model)
        if not mm["hub_id"] or any(mm[k] is None for k in memplan.Arch.FIELDS):
            continue
        arch = memplan.Arch.from_mapping(mm, source=name)
        if arch.params >= cur:
            continue
        if fits_with(ctx, replace(s, lora_rank=int(VerlView.of(m).model.lora_rank or 0)), arch) is not None:
            smaller.append((arch.params, name))
    if smaller:
        smaller.sort(key=lambda x: (-x[0], x[1]))
        p, name = smaller[0]
        hw = ctx.lab.hardware.name
        lines.append(f"a smaller model: model={name} ({p / 1e9:.1f}B) fits these cards"
                     + (f" (also: {', '.join('model=' + n for _, n in smaller[1:])})" if len(smaller) > 1 else "")
                     + f"; its own command: make fit ARGS=\"model={name}" + (f" hardware={hw}" if hw else "") + '"')
    else:
        lines.append("a smaller model: none of conf/model/ fits these cards either")
    return lines
