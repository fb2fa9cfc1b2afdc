"""How close the memory plan is, per regime, from the recorded GPU runs: what the plan's verdicts and texts quote.

What is measured, the regimes and how verdicts use them: docs/memory_plan.md.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from grpo_lab import facts

ROOT = facts.ROOT
TABLE = ROOT / "benchmarks" / "gpu" / "memplan_calibration.json"
TABLE_MD = "benchmarks/gpu/memplan_calibration.md"
COMMAND = "python benchmarks/calibrate_memplan.py --write"

# the plan's accuracy target against the recorded runs (the calibration fails a job outside it): docs/memory_plan.md
STATED = {"training": 0.15, "kv_cache": 0.10}

# where no recorded run measured a regime, a predicted peak up to this far above the card is a warning, not a refusal
UNMEASURED_MARGIN = 0.25

# the verdict phases and the calibrated quantity that vouches for each (generation and weight sync are the trainer's
# state plus exact budgets: vLLM's util x card, the weight-sync bucket)
PHASE_BASIS = {"generation": "training", "training": "training", "weight_sync": "training"}

SIZE_CLASSES = ((10e6, "under 10M parameters"), (1e9, "10M-1B parameters"), (10e9, "1B-10B parameters"),
                (math.inf, "10B parameters and more"))

WHAT = {"training": "verl's actor/perf/max_memory_reserved_gb (the trainer's torch allocator, all its phases)",
        "kv_cache": "vLLM's KV cache (its start-up log)"}


def regime_of(arch: Any, s: Any) -> str:
    """The regime of a plan: one GPU or several, size class, engine, then what sets it apart (LoRA, MoE, FSDP2)."""
    size = next(name for limit, name in SIZE_CLASSES if arch.params < limit)
    parts = ["one GPU" if s.n_gpus == 1 else "several GPUs", size,
             "SGLang" if str(s.rollout_engine).lower() == "sglang" else "vLLM"]
    apart = {"LoRA": s.lora_rank > 0, "mixture of experts": getattr(arch, "is_moe", False),
             "FSDP2": str(getattr(s, "strategy", "fsdp")) == "fsdp2"}
    return ", ".join(parts + [name for name, on in apart.items() if on])


@functools.cache
def table() -> dict[str, Any]:
    return facts.load_json_or(TABLE, {})


def entry(regime: str, quantity: str) -> dict[str, Any] | None:
    """The table's summary for one regime and quantity ("training" or "kv_cache"), or None when not measured."""
    row = (table().get("regimes") or {}).get(regime, {}).get(quantity)
    return row if row and row.get("runs") else None


def margin_of(row: dict[str, Any] | None) -> float:
    """How far above the card a predicted peak may be and still run: the plan's largest measured overshoot of the
    allocated peak (plan / measured - 1, never below 0), or UNMEASURED_MARGIN without a recorded run."""
    if row is None:
        return UNMEASURED_MARGIN
    worst = float(row.get("allocated_ratio_max", row["ratio_max"]))
    return max(0.0, math.ceil((worst - 1.0) * 100 - 1e-9) / 100)


def phase_calibration(regime: str, phase: str) -> dict[str, Any]:
    """plan.json's record for one verdict: whether its regime was measured, the margin used, the range measured."""
    quantity = PHASE_BASIS.get(phase, phase)
    row = entry(regime, quantity)
    out: dict[str, Any] = {"regime": regime, "measured": row is not None, "margin": margin_of(row),
                           "basis": quantity}
    if row is not None:
        out.update(range=[row["ratio_min"], row["ratio_max"]], runs=row["runs"])
    return out


def calibration_of(arch: Any, s: Any) -> dict[str, Any]:
    """plan.json's `calibration`: per verdict, the regime, whether a recorded run measured it, the margin used."""
    regime = regime_of(arch, s)
    out: dict[str, Any] = {ph: phase_calibration(regime, ph)
                           for ph in ("generation", "training", "weight_sync", "kv_cache")}
    out["host_ram"] = {"regime": regime, "measured": False, "margin": 0.0, "basis": "host_ram",
                       "note": "host RAM is not calibrated: compared with the RAM as planned (the kernel's OOM killer "
                               "ends a run without a Python error)"}
    out["table"] = TABLE_MD
    return out


def describe(cal: dict[str, Any]) -> str:
    """One clause for messages: how sure the plan is in this regime."""
    if cal.get("measured"):
        lo, hi = cal["range"]
        return (f"in this regime ({cal['regime']}) the plan was {lo:.2f}-{hi:.2f} of {WHAT[cal['basis']]} on "
                f"{cal['runs']} recorded run(s) ({TABLE_MD})")
    return (f"not measured: no recorded run of this regime ({cal['regime']}); refused only above the card by more "
            f"than {cal['margin']:.0%}")


def accuracy_lines(regime: str) -> list[str]:
    """What `make plan` and `make fit` print about the plan's accuracy in this regime."""
    row, kv = entry(regime, "training"), entry(regime, "kv_cache")
    if row is None:
        training = (f"training peak: not measured in this regime ({regime}); refused only above the card by more "
                    f"than {UNMEASURED_MARGIN:.0%}")
    else:
        alloc = (f" ({row['allocated_ratio_min']:.2f}-{row['allocated_ratio_max']:.2f} of its allocated peak)"
                 if "allocated_ratio_max" in row else "")
        training = (f"training peak: plan {row['ratio_min']:.2f}-{row['ratio_max']:.2f} of verl's reserved "
                    f"peak{alloc} on {row['runs']} recorded run(s) of this regime ({regime}; {TABLE_MD}); "
                    f"refused only above the card by more than {margin_of(row):.0%}")
    return [training, f"vLLM KV cache: not measured in this regime ({regime})" if kv is None else
            f"vLLM KV cache: plan {kv['ratio_min']:.2f}-{kv['ratio_max']:.2f} of what vLLM reported on "
            f"{kv['runs']} recorded run(s) of this regime"]
