"""The capacity table: what fits and how long the guide's run takes, every model option on every hardware option.

    python -m grpo_lab.launch.capacity          # = make capacity; docs/time_plan.md holds its output

Each config is composed as `python run.py model=<m> hardware=<h>` composes it (Hydra, then the job's prepare stage;
the environment's knobs are not read), and make fit's search (grpo_lab/checks/fit.py) takes the fastest settings that
fit every phase. A row says what that is (full fine-tuning, with offload, LoRA, or nothing), its peak phase and vLLM's
KV cache, and the time plan's steady step and whole run for those settings. Model options with the same rows share
one; a hardware option with the same rows as another is named in the header instead. What the table means and its
caveats: docs/time_plan.md.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_lab import facts
from grpo_lab.memory import timeplan
from grpo_lab.progress import progress

COMMAND = "make capacity"
if TYPE_CHECKING:
    from grpo_lab.memory.run import Run

MODULE = "python -m grpo_lab.launch.capacity"
# left out, and why (the header says so)
LEFT_OUT = {
    "tiny_qwen3": "a 0.34M-parameter random model for checking an install",
    "smollm2_135m": "the offline teaching model of the arithmetic task, which scores 0 on GSM8K",
    "ray_cluster": "it joins a running Ray cluster by its address; each node is an rtx4080x4",
}
# one row more: the LoRA preset's model fully fine-tuned (its LoRA and the actor's offload off)
FULL_8B = ("qwen3_8b_lora", ("actor_rollout_ref.model.lora_rank=0",
                             "actor_rollout_ref.actor.fsdp_config.param_offload=false",
                             "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false"))
FULL_8B_NAME = "qwen3_8b_lora, LoRA off"
PHASES = ("generation", "training", "weight_sync")
# make fit's changes in words ({v}: the value it sets); others by their title
SHORT = {"opt_offload": "optimizer offload", "param_offload": "parameter offload", "tp": "rollout TP {v}",
         "tp_fix": "rollout TP {v}", "util": "vLLM util {v}", "bucket": "sync bucket {v} MiB",
         "token_budget": "token budget {v}", "budget_fix": "token budget {v}", "lora": "LoRA",
         "fused": "fused log-prob", "larger_budgets": "token budgets {v}"}
OFFLOAD = {"opt_offload", "param_offload"}
LORA_RANK = "actor_rollout_ref.model.lora_rank"
HEAD = ["model", "hardware", "fits", "make fit's changes", "peak phase per GPU", "KV cache tokens", "step", "run"]


@dataclass(frozen=True)
class Row:
    model: str
    hardware: str
    fits: str       # full, full + changes, offload, LoRA r<rank>, no, refused: [rule]
    changes: str    # make fit's changes in words
    peak: str       # the largest phase per GPU of the settings shown, of the card
    kv_tokens: str  # vLLM's KV cache per replica
    step: str       # the time plan's steady step
    run: str        # the time plan's whole run
    # not shown: (parameters, the GPUs' memory together) for the order; the time plan's run facts for the header
    order: tuple = field(default=(0, 0), compare=False)
    run_facts: tuple = field(default=(), compare=False)
    emulated: bool = field(default=False, compare=False)  # the hardware option emulates a smaller card

    def cells(self) -> list[str]:
        return [self.model, self.hardware, self.fits, self.changes, self.peak, self.kv_tokens, self.step, self.run]

    def result(self) -> tuple:
        return (*self.cells()[2:], self.run_facts)


def options(group: str) -> list[str]:
    """The options of a conf/ group, less those LEFT_OUT."""
    return sorted(p.stem for p in (facts.CONF / group).glob("*.yaml") if p.stem not in LEFT_OUT)


def composed(overrides: list[str]) -> Run:
    """The Run of a job of `python run.py OVERRIDES` after its prepare stage (Hydra initialised)."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig

    from grpo_lab.launch.prepare import Job, prepare

    cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    prepared = prepare(cfg, Job(Path("capacity"), False, ""))  # no sweep point: nothing is written for the job
    return prepared.run


def _peak(plan: dict[str, Any], card: float) -> str:
    phase = max(PHASES, key=lambda ph: plan["phases"][ph]["peak_gb_per_gpu"])
    return f"{phase.replace('_', ' ')} {plan['phases'][phase]['peak_gb_per_gpu']:.2f} / {card:g} GB"


def _changes(res: Any) -> tuple[str, bool]:
    """(make fit's changes in words, whether one offloads the actor's state to host RAM)."""
    def words(changes: list[Any]) -> str:
        return ", ".join(SHORT[c.move].format(v=c.overrides[0].split("=", 1)[1] if c.overrides else "")
                         if c.move in SHORT else c.title for c in changes)

    faster = f"; faster: {words(res.speedups)}" if res.speedups else ""  # the same algorithm, a shorter step
    return (words(res.changes) or "none") + faster, any(c.move in OFFLOAD for c in res.changes)


def row(model: str, hardware: str, extra: tuple[str, ...] = ()) -> Row:
    """One config's row: make fit's search on it, and the memory and time plans of the settings it takes."""
    from grpo_lab.checks.fit import FitError, fit

    run = composed([f"model={model}", f"hardware={hardware}", *extra])
    name = FULL_8B_NAME if extra else model
    emulated = run.lab.hardware.emulate.real_gpu_memory_gb is not None
    try:
        res = fit(run)
    except FitError as e:
        return Row(name, hardware, "refused", str(e).split(":")[0], "-", "-", "-", "-", emulated=emulated)
    if res.blocked:
        return Row(name, hardware, "refused: " + " ".join(b.split("]")[0] + "]" for b in res.blocked),
                   "-", "-", "-", "-", "-", emulated=emulated)
    plan, times = (res.after, res.time_after) if res.ok else (res.before, res.time_before)
    rank = int(res.values.get(LORA_RANK) or run.cfg.model.lora_rank or 0)
    changes, offload = _changes(res)
    if not res.ok:  # nothing fits; or (a bug) the fitted settings failed the preflight's re-check
        fits, changes = ("no", "-") if res.after is None else ("no: the fit failed its re-check", "-")
    elif rank:
        fits = f"LoRA r{rank}"
    else:
        fits = "full" if not res.changes else "offload" if offload else "full + changes"
    step, run, said = "-", "-", ()
    if times:
        said = (times["steps"], times["assumed"]["response_tokens"], times["validations"], times["card"]["scaled"])
        if res.ok:
            step, run = f"{times['step_s']:.0f} s", timeplan.duration(times["run_s"])
    return Row(name, hardware, fits, changes, _peak(plan, res.card_gb), f"{max(0, plan['kv_cache']['tokens']):,}",
               step, run, order=(plan["params"], plan["card_gb"] * plan["n_gpus"]), run_facts=said, emulated=emulated)


def grid() -> tuple[list[Row], dict[str, str], dict[str, Any]]:
    """(the rows in order, {hardware option: the option whose rows it has}, the guide's run as composed)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(facts.CONF), version_base=None):
        configs = [(m, ()) for m in options("model")] + [FULL_8B]
        pairs = [(h, c) for h in options("hardware") for c in configs]
        rows = {(h, c): row(c[0], h, c[1]) for h, c in progress(pairs, COMMAND, unit="configs")}
        table = {h: {c: rows[h, c] for c in configs} for h in options("hardware")}
        job = composed([])
    data = job.cfg.data
    run = {"rows": job.lab.dataset.train_rows, "batch": data.train_batch_size, "epochs": job.cfg.trainer.total_epochs,
           "n": job.cfg.rollout.n, "prompt": data.max_prompt_length, "response": data.max_response_length,
           "dataset": job.lab.dataset.name}
    merged: dict[str, str] = {}  # an emulation that plans exactly as another option is named, not repeated
    for h, by in table.items():
        if any(r.emulated for r in by.values()):
            same = next((g for g in table if g != h and all(table[g][c].result() == by[c].result() for c in configs)),
                        None)
            if same is not None:
                merged[h] = same
    kept = [h for h in table if h not in merged]
    groups: dict[tuple, list[str]] = {}  # model options with the same rows on every hardware share them
    for c in configs:
        groups.setdefault(tuple(table[h][c].result() for h in kept), []).append(table[kept[0]][c].model)
    names = {g[0]: ", ".join(g) for g in groups.values()}
    out = [replace(r, model=names[r.model]) for h in kept for r in table[h].values() if r.model in names]
    out.sort(key=lambda r: (r.order[0], r.model, r.order[1], r.hardware))
    return out, merged, run


def header(rows: list[Row], merged: dict[str, str], run: dict[str, Any]) -> list[str]:
    """What the table is, how it was made, and what it leaves out: markdown paragraphs."""
    said = {r.run_facts[:3] for r in rows if r.run_facts}
    steps, response, validations = min(said) if len(said) == 1 else ("(per config)", run["response"], "its")
    fitted = sorted({r.hardware for r in rows if r.run_facts and "not measured" not in r.run_facts[3]})
    on_it = f"the card{'s' if len(fitted) > 1 else ''} of {', '.join(fitted)}; " if fitted else ""
    cards = sorted(timeplan.recorded_cards(), reverse=True) or ["H200"]
    return [
        f"Made by `{COMMAND}` (`{MODULE}`), on no GPU: each row is `python run.py model=<model> "
        f"hardware=<hardware>` as composed, the guide's run on `dataset={run['dataset']}` ({run['batch']} prompts x "
        f"{run['n']} answers a step, {run['prompt']} + {run['response']} tokens, {run['rows']:,} rows / "
        f"{run['batch']} x {run['epochs']} epochs = {steps} steps), with the fastest settings that fit as `make fit` "
        f"finds them (`make fit ARGS=\"model=<model> hardware=<hardware>\"` prints them as one command, or what "
        f"would fit).",
        "",
        "- fits: `full` as composed; `full + changes` and `offload`: full fine-tuning with make fit's changes "
        "(`offload`: part of the actor's state in host RAM between phases); `LoRA r<rank>`: adapters of that rank "
        "instead of the whole model (what is trained changes); `no`: nothing make fit tries fits (the peak is then "
        "as composed). Fitting is the memory plan's verdict: every phase below 80% of the card and of host RAM; "
        "several GPUs are not measured (docs/memory_plan.md). After `faster:`, what make fit adds where every phase "
        "still fits, for a step a tenth or more shorter by the time plan with the same algorithm (verl's fused "
        "log-prob, larger token budgets: docs/presets.md).",
        f"- `{FULL_8B_NAME}`: that option with {', '.join(f'`{o}`' for o in FULL_8B[1])}: Qwen3-8B fully "
        f"fine-tuned, where it fits.",
        f"- step and run: planned, not measured: the time plan of the settings shown, fitted to solo runs on one "
        f"{' or one '.join(cards)} ({on_it}`benchmarks/gpu/timeplan_calibration.md`); a card without a recorded run "
        f"is scaled from the H200 by published bf16 FLOP/s and memory bandwidth, and no run on several GPUs is "
        f"recorded. Every answer is assumed to run to "
        f"max_response_length ({response} tokens): an upper bound where answers stop earlier. run: start-up, the "
        f"{steps} steps and {validations} validations (docs/time_plan.md).",
        "- left out: " + "; ".join(f"`{k}` ({v})" for k, v in LEFT_OUT.items())
        + "".join(f"; `{h}` plans exactly as `{g}`: its rows are those" for h, g in merged.items()) + ".",
    ]


def wrap(paragraph: str, width: int = 120) -> list[str]:
    """A markdown paragraph in lines of at most `width` (a code span is never broken; a list item's lines indented)."""
    lines: list[str] = []
    for word in re.findall(r"(?:`[^`]*`|[^\s`])+", paragraph):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(("  " if lines and paragraph.startswith("- ") else "") + word)
    return lines


def table() -> str:
    rows, merged, run = grid()
    lines = [line for p in header(rows, merged, run) for line in (wrap(p) if p else [""])]
    lines += ["", "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv:  # no options: -h/--help is the usage line, anything else a mistake
        usage = f"usage: {MODULE}   (no arguments: prints the capacity table, docs/time_plan.md's capacity table)"
        print(usage, file=sys.stdout if argv[0] in ("-h", "--help") else sys.stderr)
        return 0 if argv[0] in ("-h", "--help") else 2
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
