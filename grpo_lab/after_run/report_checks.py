"""The report's checks: one verdict per metric the guide names (ok / warn / bad, each with what to do about it), read
from a job's `RunInfo` (grpo_lab/after_run/run_info.py); `run_checks` runs them all. The list: docs/after_run.md."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from grpo_lab import facts
from grpo_lab.after_run import doctor
from grpo_lab.after_run import metrics as M
from grpo_lab.after_run.run_info import RunInfo, int_or_none
from grpo_lab.verl_keys import get as _get
from grpo_lab.verl_keys import thaw

OK, WARN, BAD = "ok", "warn", "bad"

# thresholds (the guide: pg_clipfrac and ppo_kl "small, a few percent"; few truncated answers)
CLIP_WARN, CLIP_BAD = 0.05, 0.20
PG_CLIPFRAC_WARN, PG_CLIPFRAC_BAD = 0.05, 0.20
PPO_KL_WARN, PPO_KL_BAD = 0.05, 0.20
ENTROPY_FLOOR = 0.05  # nats: "fell to zero"
ENTROPY_RATIO_WARN, ENTROPY_RATIO_BAD = 0.6, 0.3  # end / start
MEM_WARN, MEM_BAD = 0.85, 0.95  # of the card
MEM_ROOM = 0.5  # below this share of the card, the check points at make fit's moves for time
PROBS_DIFF_MARGIN = 0.2  # warn this share above the largest steady value of the recorded runs (recorded_probs_diff)
PROBS_DIFF_FAQ = 0.005  # verl's FAQ (rollout vs training precision): the threshold where no run is recorded
RECORDED = facts.ROOT / "benchmarks" / "gpu" / "results"
KV_SHORT = 0.5  # vLLM's measured KV cache below this share of the plan's: something else took the memory
PLAN_OFF = 0.15  # a measured peak further than this from the preflight's plan is flagged, with both numbers
GIB_GB = 2**30 / 1e9  # verl and vLLM print GiB (verl labels them "GB"); the plan counts 1e9 bytes
# one-sided 99% critical values of Student's t by degrees of freedom (n - 2): a trend must beat the noise clearly
_T_CRIT = ((1, 31.8), (2, 6.96), (3, 4.54), (4, 3.75), (5, 3.36), (6, 3.14), (7, 3.0), (8, 2.9), (10, 2.76),
           (12, 2.68), (15, 2.6), (20, 2.53), (30, 2.46), (60, 2.39))


@dataclass
class Check:
    metric: str
    status: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


MetricCheck = Callable[[RunInfo, pd.Series], tuple[str, str]]  # a check of one metric's values: (status, message)


def _of(metric: str, missing: str | None = "not logged.") -> Callable[[MetricCheck], Callable[[RunInfo], Check | None]]:
    """The check of one metric from its values at the steps that trained, which the function gets and gives (status,
    message) of; where there are none, `missing` is the warning (None: no check)."""

    def deco(fn: MetricCheck) -> Callable[[RunInfo], Check | None]:
        @functools.wraps(fn)
        def check(run: RunInfo) -> Check | None:
            s = M.train_series(run.df, metric)
            if s.empty:
                return None if missing is None else Check(metric, WARN, missing)
            return Check(metric, *fn(run, s))

        return check

    return deco


# ---------------------------------------------------------------------------------------------------------------------
# statistics


@dataclass
class Trend:
    n: int
    slope: float  # per step
    t: float  # slope / its standard error
    first: float  # mean of the first third
    last: float  # mean of the last third

    @property
    def direction(self) -> str:
        crit = next((t for d, t in reversed(_T_CRIT) if self.n - 2 >= d), math.inf)
        if self.slope > 0 and self.t >= crit and self.last > self.first:
            return "rising"
        if self.slope < 0 and self.t <= -crit and self.last < self.first:
            return "falling"
        return "flat"


def trend(s: pd.Series) -> Trend | None:
    """A noise-aware trend: least-squares slope and its t value, and first-third vs last-third means."""
    s = s.dropna()
    n = len(s)
    if n < 3:
        return None
    x = np.asarray(s.index, dtype=float)
    y = np.asarray(s.values, dtype=float)
    k = max(1, n // 3)
    first, last = float(y[:k].mean()), float(y[-k:].mean())
    xc = x - x.mean()
    sxx = float((xc ** 2).sum())
    if sxx == 0:
        return Trend(n, 0.0, 0.0, first, last)
    slope = float((xc * (y - y.mean())).sum() / sxx)
    resid = y - (y.mean() + slope * xc)
    s2 = float((resid ** 2).sum() / (n - 2))  # n >= 3
    se = math.sqrt(s2 / sxx) if s2 > 0 else 0.0
    t = slope / se if se else math.copysign(math.inf, slope) if slope else 0.0
    return Trend(n, slope, t, first, last)


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def _pct(v: float) -> str:
    p = 100 * v
    return f"{p:.1g}%" if p != 0 and abs(p) < 0.1 else f"{p:.1f}%"


# ---------------------------------------------------------------------------------------------------------------------
# the checks


@_of("critic/score/mean", "no reward logged yet (no training step finished).")
def check_reward(run: RunInfo, s: pd.Series) -> tuple[str, str]:
    if _random_weights(run):
        return OK, f"random weights: reward not meaningful (mean {_fmt(float(s.mean()))} over {len(s)} step(s))."
    if len(s) < 3:
        return WARN, f"too few steps to judge ({len(s)}; at least 3): last {_fmt(float(s.iloc[-1]))}."
    tr = trend(s)
    assert tr is not None
    if float(s.abs().max()) == 0.0:
        clip = M.train_series(run.df, "response_length/clip_ratio")
        why = ""
        if not clip.empty and float(clip.mean()) >= CLIP_WARN:
            why = (f" {_pct(float(clip.mean()))} of the answers are cut at max_response_length, and a cut answer "
                   "scores 0: see response_length/clip_ratio.")
        return BAD, (f"reward is 0 on every one of {len(s)} steps: no answer is ever right.{why} "
                     "Check the reward function and the data format (GSM8K answers end in '#### n').")
    detail = (f"first-third mean {_fmt(tr.first)} -> last-third mean {_fmt(tr.last)} over {tr.n} steps "
              f"(slope {tr.slope:+.3g}/step, t={_fmt(tr.t, 2)})")
    if tr.direction == "rising":
        return OK, f"rising through the noise: {detail}."
    if tr.direction == "falling":
        return BAD, (f"falling: {detail}. Learning is going wrong: lower the learning rate "
                     f"({_lower_lr(run)}), check actor/ppo_kl and actor/entropy, look at samples.")
    if tr.first >= 0.85:
        return OK, f"high and flat (saturated): {detail}."
    return WARN, (f"no clear trend yet (change within the noise): {detail}. Give it more steps; if it "
                  "stays flat, check the clip ratio (truncated answers score 0) and the learning rate.")


def check_validation(run: RunInfo, reward: Trend | None) -> Check:
    col = M.primary_val_column(run.df)
    test_freq = int_or_none(run.cfg.trainer.test_freq)
    if col is None:
        if test_freq is not None and test_freq <= 0:
            return Check("val-core", WARN, f"validation is off (trainer.test_freq={test_freq}): nothing to follow the "
                                           "reward with. Turn it on: test_freq=10.")
        when = f" (trainer.test_freq={test_freq})" if test_freq else ""
        return Check("val-core", WARN, f"no validation metric (val-core/... or val/test_score/...) yet{when}.")
    s = run.df[col].dropna()
    if len(s) < 2:
        return Check(col, WARN, f"one validation point so far: {_fmt(float(s.iloc[-1]))} at step {int(s.index[-1])}.")
    first, last = float(s.iloc[0]), float(s.iloc[-1])
    delta = last - first
    span = f"{_fmt(first)} (step {int(s.index[0])}) -> {_fmt(last)} (step {int(s.index[-1])})"
    val_dir = "rising" if delta > 0.01 else "falling" if delta < -0.01 else "flat"
    reward_dir = reward.direction if reward else None
    if val_dir == "falling":
        return Check(col, BAD, f"validation falls: {span}. The policy gets worse on the test set: overfitting or "
                               "reward hacking; look at validation samples (trainer.log_val_generations=10).")
    if val_dir == "rising":
        follows = " and follows the reward" if reward_dir == "rising" else ""
        return Check(col, OK, f"validation rises{follows}: {span}.")
    if reward_dir == "rising":
        return Check(col, WARN, f"the reward rises but validation does not: {span}. Overfitting to the training "
                                "prompts or reward hacking; look at samples (trainer.log_val_generations=10).")
    return Check(col, WARN, f"validation flat: {span}.")


def _thinking_advice(run: RunInfo) -> str:
    limit = run.max_response_length
    longer = f"max_response_length={2 * limit}" if limit else "max_response_length=2048"
    base = _base_model_option(run.model_name)
    if run.thinking is False:
        return (f" The model does not think, so the answers themselves are too long: raise the limit ({longer}) or "
                "check the prompt format and stop tokens.")
    return (" Qwen3 thinks by default (<think>...</think>): the reasoning eats max_response_length, the answer is cut "
            "before '#### n' and scores 0. Fixes: a longer limit " + longer + " (costlier: longer generation, more KV "
            f"cache), or the base model ({base}, R1-Zero style), or turn thinking off in the chat template "
            "(+data.apply_chat_template_kwargs.enable_thinking=false).")


def _base_model_option(model_name: str | None) -> str:
    name = (model_name or "").lower()
    conf = facts.ROOT / "conf" / "model"
    for size in ("0_6b", "1_7b", "4b", "8b"):
        if f"qwen3_{size}" in name or f"qwen3-{size.replace('_', '.')}" in name:
            if (conf / f"qwen3_{size}_base.yaml").exists():
                return f"model=qwen3_{size}_base"
    return "model=qwen3_1_7b_base"


@_of("response_length/clip_ratio")
def check_clip_ratio(run: RunInfo, s: pd.Series) -> tuple[str, str]:
    k = max(1, len(s) // 3)
    recent = float(s.iloc[-k:].mean())
    limit = run.max_response_length
    lim = f"max_response_length={limit}" if limit else "max_response_length"
    mean_len = M.series(run.df, "response_length/mean")
    length = f" (response_length/mean {_fmt(float(mean_len.iloc[-1]))})" if not mean_len.empty else ""
    msg = f"{_pct(recent)} of the answers are cut at {lim}{length}"
    if len(s) > 1:
        msg += f", over the last {k} step(s)"
    if _random_weights(run):
        return OK, (f"random weights: {msg}; noise runs to the limit (the worst case for time and "
                    "memory), not a prompt or length problem.")
    if recent >= CLIP_WARN:
        return BAD if recent >= CLIP_BAD else WARN, msg + "." + _thinking_advice(run)
    return OK, msg + ": few truncated."


def _lower_lr(run: RunInfo) -> str:
    """A lower learning rate to try: a third of the job's own (the sweeps move by ~3x), else the guide's 1e-6 halved."""
    lr = M.finite_float(run.cfg.actor.optim.lr)
    if lr is None or lr <= 0:
        return "actor_lr=5e-7"

    def short(x: float) -> str:  # 1e-05 -> 1e-5, as the configs write it
        return re.sub(r"e([+-])0*(\d)", lambda m: "e" + m.group(1).replace("+", "") + m.group(2), f"{x:.1g}")

    return f"actor_lr={short(lr / 3)}, a third of this job's {short(lr)}"


@_of("response_length/max")
def check_response_max(run: RunInfo, s: pd.Series) -> tuple[str, str]:
    limit = run.max_response_length
    peak = float(s.max())
    if not limit:
        return OK, f"longest answer {_fmt(peak)} tokens (limit unknown: no verl_config.yaml)."
    at = int((s >= limit).sum())
    msg = f"longest answer reaches the limit {limit} on {at} of {len(s)} steps (max {_fmt(peak)})"
    if at == 0:
        return OK, f"longest answer {_fmt(peak)} tokens, below the limit {limit}."
    if at * 2 >= len(s):
        return WARN, msg + ": answers run into the limit; see response_length/clip_ratio for how many."
    return OK, msg + "."


@_of("actor/entropy")
def check_entropy(run: RunInfo, s: pd.Series) -> tuple[str, str]:
    temp = M.finite_float(run.cfg.rollout.temperature)
    hotter = (f", sampling temperature 1.0 instead of {temp:g} (actor_rollout_ref.rollout.temperature=1.0)"
              if temp is not None and temp < 1 else "")
    remedy = (" Keep exploring: entropy_coeff=0.001 (an entropy bonus), clip-higher "
              "actor_rollout_ref.actor.clip_ratio_high=0.28 (as variant=dapo does), a lower learning rate "
              f"({_lower_lr(run)}){hotter}.")
    if len(s) < 3:
        end = float(s.iloc[-1])
        if end < ENTROPY_FLOOR:
            return BAD, f"entropy {_fmt(end)}: already near zero (collapsed)." + remedy
        return WARN, f"too few steps to judge ({len(s)}): entropy {_fmt(end)}."
    k = max(1, len(s) // 5)
    start, end = float(s.iloc[:k].mean()), float(s.iloc[-k:].mean())
    ratio = end / start if start > 0 else 1.0
    span = (f"{_fmt(start)} -> {_fmt(end)} (" + (f"means of the first and last {k} steps, " if k > 1 else "first and "
            "last step, ") + f"{len(s)} steps)")
    if end < ENTROPY_FLOOR:
        return BAD, f"entropy collapse: {span}, near zero: the policy stopped exploring." + remedy
    if ratio < ENTROPY_RATIO_BAD:
        return BAD, f"entropy collapse: fell to {_pct(ratio)} of its start, {span}." + remedy
    if ratio < ENTROPY_RATIO_WARN:
        return WARN, f"entropy falling fast: {_pct(ratio)} of its start, {span}." + remedy
    return OK, f"no collapse: {span}."


def _small(run: RunInfo, metric: str, warn: float, bad: float, what: str) -> Check:
    s = M.train_series(run.df, metric)
    if s.empty:
        return Check(metric, WARN, "not logged.")
    k = max(1, len(s) // 3)
    v = abs(float(s.iloc[-k:].mean()))
    peak = float(s.abs().max())
    msg = f"{what} {_pct(v)} (mean of the last {k} step(s); max {_pct(peak)})"
    remedy = (f" The policy moves too far per step: lower the learning rate ({_lower_lr(run)}) or take fewer updates "
              "per step (ppo_mini_batch_size equal to train_batch_size: 1 update; "
              "actor_rollout_ref.actor.ppo_epochs=1).")
    if v > bad:
        return Check(metric, BAD, msg + ": far above a few percent." + remedy)
    if v > warn:
        return Check(metric, WARN, msg + ": above a few percent." + remedy)
    return Check(metric, OK, msg + ": small, as it should be.")


def check_timing(run: RunInfo) -> Check:
    df = run.df
    metric = " vs ".join(M.column(df, name) or name for name in ("timing_s/gen", "timing_s/update_actor"))
    gen, upd, step = (M.steady_mean(M.train_series(df, f"timing_s/{t}")) for t in ("gen", "update_actor", "step"))
    if gen is None or upd is None:
        return Check(metric, WARN, "no phase timings logged yet.")
    of_step = f" of a {_fmt(step)} s step" if step else ""
    note = " (means without step 1, which carries the warm-up)" if len(M.train_series(df, "timing_s/gen")) > 1 else ""
    msg = f"generation {_fmt(gen)} s, actor update {_fmt(upd)} s{of_step}{note}"
    if gen >= upd:
        return Check(metric, OK, msg + ": generation takes longer than training.")
    fsdp = run.cfg.actor.fsdp_config
    why = ("; optimizer/param offload is on (each update moves state over PCIe)"
           if fsdp.optimizer_offload or fsdp.param_offload else "")
    # most recorded runs train longer than they generate (benchmarks/gpu/results/): no verdict on the split
    return Check(metric, OK, msg + ": training takes longer than generation, as in most recorded runs" + why + ".")


def check_step_plan(run: RunInfo) -> Check:
    """The measured steady step (without validation: metrics.step_less_validation) against the time plan at this
    run's own prompt and answer lengths (grpo_lab/memory/timeplan.py); flagged when further apart than the plan's
    stated accuracy."""
    from grpo_lab.memory import memplan, timeplan

    metric = "timing_s/step vs the time plan"
    step = M.steps_less_validation(run.df)
    lengths = [M.steady_mean(M.train_series(run.df, k)) for k in
               ("prompt_length/mean", "response_length/mean", "response_length/max")]
    if step.empty or None in lengths or not run.verl:
        return Check(metric, WARN, "no step timings or lengths logged yet (or no verl_config.yaml).")
    measured = M.steady_mean(step)
    arch, st = run.job.model.arch, run.job.settings
    if arch is None and st is not None:  # a recorded job folder without .hydra/: the model option of its folder's name
        from grpo_lab.memory.memplan_arch import Arch

        info = facts.model_group_of_folder(str(run.cfg.model.path or "").rstrip("/").rsplit("/", 1)[-1])
        arch = Arch.from_mapping(info) if info and info.get("hidden_size") else None
    if arch is None or st is None:
        return Check(metric, WARN, f"{_fmt(measured)} s a step; no architecture facts to plan it with.")
    w = timeplan.Work(st.train_batch_size * st.rollout_n / max(1, st.n_gpus), *lengths)
    card = timeplan.Card.of(run.lab.hardware)
    planned = sum(timeplan.phase_seconds(timeplan.features(arch, st, w, card, memplan.kv_cache(arch, st)),
                                         timeplan.table().get("coefficients") or {}).values())
    ratio = planned / measured if measured else math.inf
    msg = (f"measured {_fmt(measured)} s a step (without step 1 and validation), planned {_fmt(planned)} s at this "
           f"run's lengths ({lengths[0]:.0f}-token prompts, {lengths[1]:.0f}-token answers): plan / measured "
           f"{ratio:.2f}" + (f"; {card.scaled}" if card.scaled else ""))
    if abs(ratio - 1) > timeplan.STATED:
        return Check(metric, WARN, msg + f": outside the time plan's stated {timeplan.STATED:.0%} "
                                         f"({timeplan.TABLE_MD}); other jobs on the cards, or a regime not measured.")
    return Check(metric, OK, msg + ".")


@_of("perf/throughput", "not logged yet.")
def check_throughput(run: RunInfo, s: pd.Series) -> tuple[str, str]:
    mean = M.steady_mean(s)
    msg = f"{_fmt(mean)} tokens/s per GPU (mean without step 1)" if len(s) > 1 else f"{_fmt(mean)} tokens/s per GPU"
    tr = trend(s) if len(s) >= 6 else None
    if tr and tr.first > 0 and tr.last < 0.7 * tr.first:
        return WARN, (f"{msg}; dropping from {_fmt(tr.first)} to {_fmt(tr.last)}: longer answers "
                      "(response_length/mean) or memory pressure (more micro-batches).")
    return OK, msg + "."


def check_memory(run: RunInfo) -> Check:
    """verl's training peak (GiB) against the card and the plan: the plan is held to the allocated peak, as the
    calibration holds it (torch frees its cache and retries before an OOM); the card to the reserved one."""
    df = run.df
    alloc = M.train_series(df, "actor/perf/max_memory_allocated_gb")
    reserved = M.train_series(df, "actor/perf/max_memory_reserved_gb")
    if alloc.empty and reserved.empty:
        return Check("actor/perf/max_memory_*", WARN, "no training-memory metrics logged yet.")
    kind, held = ("allocated", alloc) if not alloc.empty else ("reserved", reserved)  # verl 0.9.1 logs both
    metric = f"actor/perf/max_memory_{kind}_gb"
    peak = float(held.max())
    peak_res = float(reserved.max()) if kind == "allocated" and not reserved.empty else None
    card = run.gpu_memory_gb  # GiB, as CUDA and verl report it (139.8 on an H200)
    head = f"training-phase peak {_fmt(peak)} GiB {kind}" + (f", {_fmt(peak_res)} GiB reserved" if peak_res else "")
    planned, plan_note = _planned_allocator(run.plan, steps=len(held))
    off = False
    if planned is not None:
        ratio = planned / (peak * GIB_GB)
        off = kind == "allocated" and abs(ratio - 1.0) > PLAN_OFF
        plan_note = (f"; the plan's {plan_note} {_fmt(planned, 4)} GB = {_fmt(planned / GIB_GB)} GiB: plan / {kind} "
                     f"{ratio:.2f}" + (f", plan / reserved {planned / (peak_res * GIB_GB):.2f}" if peak_res else ""))
    if not card:
        return Check(metric, WARN, head + plan_note + "; card memory unknown (lab.hardware.gpu_memory_gb).")
    card_kind, on_card = ("reserved", peak_res) if peak_res else (kind, peak)
    frac = on_card / card
    msg = f"{head} ({card_kind}: {_pct(frac)} of the {_fmt(card, 4)} GiB card){plan_note}"
    fixes = ", ".join(r["override"] for r in doctor.phase_remedies(run.job, "training")[1]) or (
        "what lowers the training phase's peak (the memory plan knows no override for this job)")
    if frac >= MEM_BAD:
        return Check(metric, BAD, msg + f": at the edge, the next longer batch will OOM. Try {fixes}.")
    if frac >= MEM_WARN:
        return Check(metric, WARN, msg + f": little headroom. If it OOMs: {fixes}.")
    if off:
        return Check(metric, WARN, msg + f": more than {PLAN_OFF:.0%} away from the plan, which is within that of the "
                                         "allocated peak on the recorded runs (benchmarks/gpu/memplan_calibration.md). "
                                         "Its verdicts may be off for this configuration: copy the job folder under "
                                         "benchmarks/gpu/results/ and run make calibrate.")
    tip, left = "", _speed_moves_left(run)
    if frac < MEM_ROOM and left:
        from grpo_lab.checks.plan_text import fit_command

        what = ", ".join(left[:-1]) + " and " * (len(left) > 1) + left[-1]
        tip = (f" Room to spare: {fit_command(run.overrides)} tries {what} where every phase still fits, "
               "and keeps what the time plan says makes a step a tenth or more shorter.")
    return Check(metric, OK, msg + "." + tip)


def _speed_moves_left(run: RunInfo) -> list[str]:
    """What `make fit`'s moves for time (grpo_lab/memory/fit_moves.py SPEED_MOVES) could still change in this run."""
    from grpo_lab.memory.fit_moves import larger_budgets, padded_why_not

    s = run.job.settings
    if s is None:  # a config verl could not have run
        return []
    left = []
    if not s.use_fused_kernels and not run.cfg.actor.calculate_sum_pi_squared:
        left.append("verl's fused log-prob")
    if not padded_why_not(s):
        left.append("padded micro-batches")
    if s.use_dynamic_bsz and next(larger_budgets(s.ppo_max_token_len_per_gpu), None):
        left.append("larger token budgets (fewer, larger micro-batches)")
    return left


def _planned_allocator(plan: dict[str, Any], steps: int) -> tuple[float | None, str]:
    """The plan's peak of the trainer's torch allocator (GB) for a run of `steps` updates, or (None, why not)."""
    ta = _get(plan, "memory.trainer_allocator") or {}
    peaks = {k: M.finite_float(v) for k, v in (ta.get("peaks_gb") or {}).items()
             if steps > 1 or k != "weight_sync"}
    peaks = {k: v for k, v in peaks.items() if v}
    if peaks:
        what = max(peaks, key=peaks.get)
        return peaks[what], f"trainer-allocator peak ({what.replace('_', ' ')})"
    card_level = M.finite_float(_get(plan, "memory.phases.training.peak_gb_per_gpu"))
    if card_level is None:
        return None, ""
    return None, (f"; plan.json predates the trainer-allocator plan: its {_fmt(card_level)} GB training phase is "
                  "card-level (CUDA contexts, vLLM asleep), not held to verl's peak (benchmarks/calibrate_memplan.py "
                  "replays recorded jobs with today's plan)")


@functools.cache
def recorded_probs_diff() -> tuple[float, str]:
    """The largest training/rollout_probs_diff_mean of a steady step (2 on) in the recorded runs' metrics.jsonl
    (benchmarks/gpu/results; all on Hopper cards), and its job; (0, "") where none is here."""
    best = (0.0, "")
    for f in sorted(RECORDED.rglob("metrics.jsonl")):
        steady = M.train_series(M.read_metrics(f.parent), "training/rollout_probs_diff_mean").loc[2:]
        if len(steady) and steady.max() > best[0]:
            best = (float(steady.max()), str(f.parent.relative_to(facts.ROOT)))
    return best


def probs_diff_thresholds() -> tuple[float, float, str]:
    """(warn, bad, where warn comes from): PROBS_DIFF_MARGIN above the largest recorded steady value, bad twice it."""
    top, job = recorded_probs_diff()
    if not top:
        return PROBS_DIFF_FAQ, 2 * PROBS_DIFF_FAQ, "verl's FAQ"
    warn = round(top * (1 + PROBS_DIFF_MARGIN), 4)
    return warn, 2 * warn, f"{PROBS_DIFF_MARGIN:.0%} above the largest recorded steady value, {top:.4f} ({job})"


@_of("training/rollout_probs_diff_mean", None)
def check_rollout_precision(run: RunInfo, s: pd.Series) -> tuple[str, str]:
    v = float(s.abs().max())
    warn, bad, source = probs_diff_thresholds()
    msg = f"max {_fmt(v)} (vLLM vs training token probabilities; warn above {_fmt(warn)}: {source})"
    card = str(run.lab.hardware.gpu_name or _get(run.plan, "time.card.name") or "")
    hopper = bool(re.search(r"H(100|200|800|20)\b", card))
    cause = (f"a precision mismatch on a non-Hopper card ({card}; verl's FAQ)" if card and not hopper else
             "on a Hopper card, long outputs or bf16 vs fp32 logits between vLLM and training (verl's FAQ)")
    fix = f" The likely cause: {cause}: try +actor_rollout_ref.rollout.engine_kwargs.vllm.disable_cascade_attn=true."
    if v > warn:
        return BAD if v > bad else WARN, msg + f": above {_fmt(bad if v > bad else warn)}." + fix
    return OK, msg + f": below {_fmt(warn)}."


# vLLM's worker and engine lines (vllm/v1/worker/gpu_worker.py, v1/core/kv_cache_utils.py), printed at INFO
_KV_AVAILABLE = re.compile(r"Available KV cache memory: ([0-9.]+) GiB")
_KV_TOKENS = re.compile(r"GPU KV cache size: ([0-9,]+) tokens")


def check_kv_cache(run: RunInfo) -> Check | None:
    """vLLM's KV cache as its start-up log measured it, against the plan's (plan.json memory.kv_cache); None without
    such a line or a plan. Why it can fall short: docs/after_run.md."""
    got = [float(x) * 2**30 / 1e9 for x in _KV_AVAILABLE.findall(run.log_text)]  # GiB -> GB, the plan's unit
    kv = _get(run.plan, "memory.kv_cache") or {}
    planned = M.finite_float(kv.get("kv_cache_gb"))
    if not got or not planned:
        return None
    low = min(got)
    tokens = [int(t.replace(",", "")) for t in _KV_TOKENS.findall(run.log_text)]
    tok = f", {min(tokens):,} tokens" if tokens else ""
    msg = (f"vLLM's KV cache {_fmt(low)} GB{tok} (its start-up log"
           + (f", the smallest of {len(got)} engines" if len(got) > 1 else "")
           + f"), the plan's {_fmt(planned)} GB, {int(kv.get('tokens') or 0):,} tokens")
    if abs(low / planned - 1.0) <= PLAN_OFF:
        return Check("vLLM KV cache", OK, msg + ": as planned.")
    if low >= KV_SHORT * planned:
        return Check("vLLM KV cache", WARN,
                     f"{msg}: {_pct(low / planned)} of it, more than {PLAN_OFF:.0%} away from the plan, which is "
                     "within 10% on the recorded runs (benchmarks/gpu/memplan_calibration.md). Something else on the "
                     "card while vLLM profiled (another job), or the plan is off for this configuration: copy the "
                     "job folder under benchmarks/gpu/results/ and run make calibrate.")
    waves = ""
    seq, per_replica = int_or_none(kv.get("sequence_length")), int_or_none(kv.get("trajectories_per_replica"))
    cap = int_or_none(kv.get("concurrent_sequences"))
    if tokens and seq and per_replica and cap:
        from grpo_lab.memory.memplan_phases import answer_rounds

        concurrent, rounds = answer_rounds(per_replica, min(tokens), seq, max(cap, 1))
        if rounds:
            waves = (f" Generation then runs in up to {rounds} wave(s) of "
                     f"{concurrent} answers (planned {kv.get('waves')}).")
    pin = int(planned * 1e9)
    return Check("vLLM KV cache", WARN,
                 f"{msg}: {_pct(low / planned)} of it. vLLM sizes the cache from the card's free memory while it "
                 "profiles, so what another process took at that moment is taken out of it (jobs side by side "
                 f"starting together, another user's job).{waves} Pin it to the plan's size: "
                 f"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={pin} (vLLM then sets the "
                 "cache to that size instead of measuring).")


def _random_weights(run: RunInfo) -> str:
    """The mark of a model with random weights (grpo_lab.tasks.qwen3_random): its plan.json's, else its folder's."""
    return run.plan.get("random_weights") or facts.random_weights_mark(run.cfg.model.path)


def check_random_weights(run: RunInfo) -> Check | None:
    mark = _random_weights(run)
    if not mark:
        return None
    return Check("model", WARN, f"{mark}. The memory, time and throughput checks hold; reward, validation, entropy "
                                "and clipping describe noise.")


def check_status(run: RunInfo) -> tuple[Check, list[doctor.Diagnosis]]:
    st = run.status.get("status")
    steps = M.training_steps(run.df)
    done = int(steps.max()) if len(steps) else 0
    total = int_or_none(run.cfg.trainer.total_training_steps)
    of = f" of {total}" if total and total > 0 else ""
    gone = doctor.gone_running(run.status)  # None unless status.json says running
    read_log = st == "failed" or gone or (st is None and run.log_text and not len(steps))
    diags = doctor.diagnose_path(run.run_dir)[1] if read_log else []
    if st == "ok" and run.status.get("note") == "planned":
        return Check("run", OK, "preflight only (preflight.only=true): nothing was trained; see plan.json."), diags
    if st == "ok" and not len(steps):
        logger = thaw(run.cfg.trainer.logger)
        why = f" (trainer.logger={logger} has no 'file')" if logger and "file" not in logger else ""
        return Check("run", WARN, f"finished, but no metrics were logged: no step in metrics.jsonl{why}; verl's file "
                                  "logger writes it (logger=console, the default, keeps it)."), diags
    if st == "ok":
        wall = M.finite_float(run.status.get("wall_s"))
        return Check("run", OK, f"finished: {done}{of} steps" + (f" in {wall:.0f} s." if wall else ".")), diags
    if gone:
        what = (_tried([d for d in diags if d.id != "stopped_without_error"])
                or "nothing in train.log: look at `dmesg` or the system log for the kernel's OOM killer")
        return Check("run", BAD, f"killed at step {done}{of}: status.json still says running, but {gone} "
                                 f"(SIGKILL: the kernel's OOM killer, kill -9, a machine that went down). "
                                 f"Doctor: {what}."), diags
    if st == "running" or (st is None and len(steps)):
        partial = " (the last metrics line is still being written)" if run.partial_last_line else ""
        word = "still running" if st == "running" else "no status.json"
        return Check("run", OK if st == "running" else WARN,
                     f"{word}: reported as far as it got, step {done}{of}{partial}."), diags
    refused = next((d for d in diags if d.id == "preflight_refused"), None)
    if refused is not None:
        return Check("run", BAD, f"{refused.title}; the rules and their fixes are below (plan.json)."), diags
    if st == "failed":
        err = run.status.get("error") or "no error recorded"
        what = _tried(diags) or "no known signature in train.log"
        return Check("run", BAD, f"failed after {done} step(s): {err}. Doctor: {what}."), diags
    if diags:
        what = "; ".join(d.title for d in diags)
        return Check("run", BAD, f"no status.json and no step finished. Doctor: {what}."), diags
    return Check("run", WARN, "no status.json and no metrics: the job has not started (or wrote nothing)."), diags


def _tried(diags: list[doctor.Diagnosis]) -> str:
    """The doctor's findings in a line, each with the overrides it would try."""
    return "; ".join(f"{d.title} -> try {' '.join(d.overrides)}" if d.overrides else d.title for d in diags)


def run_checks(run: RunInfo) -> tuple[list[Check], list[doctor.Diagnosis]]:
    """Every check that has something to say (those that return None have not)."""
    status, diags = check_status(run)
    checks: list[Check | None] = [status, check_random_weights(run)]
    reward_trend = trend(M.train_series(run.df, "critic/score/mean"))
    if not run.df.empty:
        checks += [check_reward(run), check_validation(run, reward_trend), check_clip_ratio(run),
                   check_response_max(run), check_entropy(run),
                   _small(run, "actor/pg_clipfrac", PG_CLIPFRAC_WARN, PG_CLIPFRAC_BAD, "clipped share"),
                   _small(run, "actor/ppo_kl", PPO_KL_WARN, PPO_KL_BAD, "policy shift per step"),
                   check_timing(run), check_step_plan(run), check_throughput(run), check_memory(run),
                   check_rollout_precision(run)]
    checks.append(check_kv_cache(run))  # from the log: also for a job that never reached a step
    return [c for c in checks if c], diags
