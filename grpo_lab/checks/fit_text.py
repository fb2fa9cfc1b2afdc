"""The fit's words: what each change costs (`cost_words`), the result it hands back (`FitResult`, one `Step` per
move), its changes as the user would type them (the short key where it feeds that verl key), and the printed result
(`format_result`: the target, the phase table before and after, the changes, what was not taken, the command).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from grpo_lab.cli.apply import Change
from grpo_lab.memory import memplan, memplan_phases
from grpo_lab.memory.fit_moves import GB, MARGIN
from grpo_lab.memory.fit_search import FitContext

# ---- what each change costs, in words and numbers ----------------------------------------------------------------

def cost_words(ctx: FitContext, move: str, before: memplan.Settings, after: memplan.Settings) -> str:
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
        ram = (memplan.host_ram(arch, after)["total_gb"], memplan.host_ram(arch, before)["total_gb"])
        return (f"about {moved / ctx.bw:.1f} s more per step: {what}, {per_gpu / GB:.2f} GB per card, {when}: "
                f"{moved:.1f} GB of host-device traffic per card over PCIe at ~{ctx.bw:g} GB/s ({ctx.bw_note}); "
                f"host RAM {ram[1]} -> {ram[0]} GB")
    if move == "util":
        k0, k1 = memplan.kv_cache(arch, before), memplan.kv_cache(arch, after)
        u0, u1 = before.gpu_memory_utilization, after.gpu_memory_utilization
        return (f"{'lower' if u1 < u0 else 'higher'} gpu_memory_utilization {u0:g} -> {u1:g}: vLLM's KV cache from "
                f"{k0['tokens']} to {k1['tokens']} tokens, i.e. {k0['concurrent_sequences']} -> "
                f"{k1['concurrent_sequences']} concurrent sequences of prompt + response ({after.seq_len} tokens), "
                f"{k0['waves'] or '-'} -> {k1['waves'] or '-'} wave(s) of generation per step")
    if move == "tp_fix":
        return (f"required, not a choice: a vLLM replica of TP {before.tp} needs {before.tp} GPUs and there are "
                f"{before.n_gpus}; TP {after.tp} gives {after.n_gpus // after.tp} replica(s)")
    if move == "budget_fix":
        return (f"required, not a choice: verl asserts each dynamic token budget holds one sequence of prompt + "
                f"response ({after.seq_len} tokens), or the first long answer stops the run")
    if move == "tp":
        r0, r1 = before.n_gpus // before.tp, after.n_gpus // after.tp
        k1 = memplan.kv_cache(arch, after)
        return (f"{r1} vLLM replica(s) instead of {r0}, each over {after.tp} cards; every generated token waits for "
                f"all-reduces over {'NVLink' if ctx.nvlink else 'PCIe'}; KV cache {k1['tokens']} tokens per replica")
    if move == "micro":
        return (f"micro-batches actor {before.ppo_micro_batch_size_per_gpu} -> {after.ppo_micro_batch_size_per_gpu}, "
                f"log-prob {before.log_prob_micro_batch_size_per_gpu} -> {after.log_prob_micro_batch_size_per_gpu} "
                f"per GPU: more, smaller passes, a somewhat slower step")
    if move == "entropy_ckpt":
        return "the entropy's softmax is recomputed in the backward instead of kept: a little more compute"
    if move == "entropy_chunk":
        return f"the entropy over the {arch.vocab_size}-token vocabulary in chunks of {after.entropy_chunk_size} " \
               f"tokens: a little slower"
    if move == "fused":
        return (f"log-probs and entropy from the hidden states {memplan_phases.FUSED_CHUNK} tokens at a time (verl's "
                f"FusedLinearForPPO) instead of its per-token loop: the same numbers within bf16 rounding, no "
                f"vocabulary-sized logits of a whole micro-batch")
    if move == "padded":
        why = (f"without flash-attn ({after.attn_implementation}), each answer attends only to itself in a micro-batch "
               f"padded to its longest answer, not across the whole packed micro-batch under a mask: the same numbers, "
               f"no attention work growing with the square of the micro-batch (answers of mixed lengths add padding)")
        if after.ppo_max_token_len_per_gpu != before.ppo_max_token_len_per_gpu:
            why += "; and " + cost_words(ctx, "larger_budgets", before, after)
        return why
    if move == "larger_budgets":
        tok = ctx.tokens_per_gpu_per_update(after)
        t0, t1 = before.ppo_max_token_len_per_gpu, after.ppo_max_token_len_per_gpu
        return (f"micro-batches of up to {t1} tokens instead of {t0} in the update (and at least that in the log-prob "
                f"passes): up to {math.ceil(tok / t1)} per update instead of {math.ceil(tok / t0)} ({tok} tokens per "
                f"GPU per update); verl packs the same sequences, fewer passes each pay the fixed costs")
    if move == "layered_summon":
        return "the LoRA weight sync gathers one layer at a time instead of the whole model: a slower sync"
    if move == "lora":
        return lora_words(arch, after.lora_rank, after.lora_targets)
    return ""


def lora_words(arch: memplan.Arch, rank: int, targets: Any) -> str:
    """What switching to LoRA costs: the fit's words for its LoRA change, and the preflight's for a fix that does."""
    n = arch.lora_params(rank, targets)
    return (f"CHANGES WHAT IS TRAINED: rank-{rank} adapters on every linear layer, "
            f"{n / 1e6:.0f}M trainable parameters ({100 * n / arch.params:.1f}% of {arch.params / 1e9:.1f}B) "
            f"instead of the whole model; the base stays frozen. Learning differs from full fine-tuning: verl's "
            f"LoRA examples use a larger learning rate (conf/model/qwen3_8b_lora.yaml: actor_lr=3e-6)")


def lora_banner(what: str, why: str = "") -> str:
    """The warning over a command or fix that trains LoRA adapters where the config trains the whole model."""
    return f"!!! LoRA: {why}this {what} trains LoRA adapters instead: WHAT IS TRAINED CHANGES !!!"


# ---- results -----------------------------------------------------------------------------------------------------

@dataclass
class Step:
    """One move of the fitted command: the changes it makes (as applied, printed and saved), what it costs, why."""

    move: str
    title: str
    changes: list[Change]  # each with the move's one-line reason, for the saved experiment file
    cost: str

    @property
    def overrides(self) -> list[str]:
        return [c.override for c in self.changes]


@dataclass
class FitResult:
    before: dict[str, Any]             # memplan.memory_plan before / after
    after: dict[str, Any] | None = None
    ok: bool = False
    lora: bool = False
    overrides: list[str] = field(default_factory=list)  # what to add to the command line
    values: dict[str, Any] = field(default_factory=dict)  # verl key -> value
    changes: list[Step] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    way_out: list[str] = field(default_factory=list)
    verified: bool = False
    verify_problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)   # non-memory preflight errors: fix these first
    evaluations: int = 0
    title: str = ""
    card_gb: float = 0.0
    host_ram_gb: float | None = None
    batch: dict[str, Any] = field(default_factory=dict)
    time_before: dict[str, Any] | None = None  # timeplan.time_plan of the user's command / of the fitted one
    time_after: dict[str, Any] | None = None
    faster_than: int = 0  # the other fitting settings found, all slower by the time plan
    guide_first: tuple[list[str], float] | None = None  # the guide's first choice (overrides, step s) when slower
    speedups: list[Step] = field(default_factory=list)  # after the memory fits: the same algorithm, a shorter step


# ---- text --------------------------------------------------------------------------------------------------------

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


def time_lines(res: FitResult) -> list[str]:
    """The time plan of the user's command and of the fit's (grpo_lab/memory/timeplan.py)."""
    from grpo_lab.memory.timeplan import duration

    out = []
    for label, t in (("your command", res.time_before), ("the fit's command", res.time_after if res.ok else None)):
        if t:
            run = f", the run ({t['steps']} steps) {duration(t['run_s'])}" if t["steps"] else ""
            out.append(f"  {label}: a step {t['step_s']:.0f} s{run}")
    if not out:
        return []
    if res.guide_first and res.time_after:
        ovr, step = res.guide_first
        out.append(f"  the guide's first choice ({' '.join(ovr)}): a step {step:.0f} s; the fit's is "
                   f"{1 - res.time_after['step_s'] / step:.0%} shorter")
    t = res.time_after or res.time_before
    why = (f"the fastest of {res.faster_than + 1} fitting settings found" if res.faster_than else "")
    head = "Predicted time (time plan" + (f"; {t['card']['scaled']}" if t["card"]["scaled"] else "") + \
        "; answers to max_response_length)" + (f": {why}" if why else "")
    return ["", head, *out]


def _numbered(head: str, changes: list[Step]) -> list[str]:
    return [head] + [ln for i, c in enumerate(changes, 1)
                     for ln in (f"  {i}. {' '.join(c.overrides)}", f"     {c.title}: {c.cost}")]


def format_result(res: FitResult, command: str | None) -> str:
    card = res.card_gb
    out = [f"grpo-lab fit: {res.title}", f"target: every phase below {int(MARGIN * 100)}% of a {card:g} GB card "
                                         f"({MARGIN * card:.1f} GB) and of host RAM"]
    out.extend(f"plan vs recorded runs: {line}" for line in (res.after or res.before or {}).get("accuracy") or ())
    if res.blocked:
        out += ["", "The preflight finds problems the fit does not touch (it changes memory settings only); fix "
                    "these first:", *(f"  {b}" for b in res.blocked)]
        return "\n".join(out)
    b = res.batch
    if b.get("train_batch_size"):
        out.append(f"kept as asked: {b['train_batch_size']} prompts x {b['rollout_n']} answers per step, mini-batch "
                   f"{b['ppo_mini_batch_size']} ({b['updates_per_step']} update(s) per step), "
                   f"{b['sequence_length']} tokens of prompt + response")
    if res.lora:
        out += ["", lora_banner("command", "full fine-tuning does not fit these cards with any setting tried; ")]
    if res.way_out:
        out += ["", "What would fit " + ("full fine-tuning:" if res.lora else "(nothing tried fits these cards):"),
                *(f"  - {w}" for w in res.way_out)]
    out += ["", "Predicted peak per GPU", *phase_table(res)]
    if res.ok or res.after:
        out.append("")
        if res.changes:
            out += _numbered("Changes, in the guide's order of preference, and what each costs", res.changes)
        else:
            out.append("No change needed: every phase already fits.")
        if res.speedups:
            out += ["", *_numbered("Faster, the same algorithm (batch, group size, lengths, learning rate and loss "
                                   "unchanged)", res.speedups)]
    if res.rejected:
        out += ["", "Not taken", *(f"  - {r}" for r in res.rejected)]
    out += [*time_lines(res), ""]
    if res.verified:
        out.append("checked: the preflight passes on the fitted config (0 errors"
                   + (f"; warnings: {' '.join(res.warnings)}" if res.warnings else "") + ")")
    elif res.after is not None:
        out += ["NOT CHECKED OK: the fitted config does not pass the preflight, so no command is given:",
                *(f"  {p}" for p in res.verify_problems)]
    out.append(f"({res.evaluations} plans evaluated)")
    if res.ok and command:
        out += ["", "The command:", f"  {command}"]
    return "\n".join(out)
