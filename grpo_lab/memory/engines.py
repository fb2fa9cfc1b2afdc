"""What `actor_rollout_ref.rollout.gpu_memory_utilization` means to each rollout engine: the static memory budget.

Pure functions on numbers (GB = 1e9 bytes, as in grpo_lab/memory/memplan.py); memplan calls them through one marked
hook.

How vLLM and SGLang each read the key, and what is on the card when SGLang starts: docs/sglang.md."""

from __future__ import annotations

ENGINES = ("vllm", "sglang")


def _check(engine: str) -> str:
    e = str(engine or "vllm").lower()
    if e not in ENGINES:
        raise ValueError(f"rollout engine {engine!r}: the memory plan knows {', '.join(ENGINES)}")
    return e


def static_budget_gb(engine: str, util: float, card_gb: float, resident_gb: float) -> float:
    """GB per GPU the engine takes for its static memory at start-up: vllm util x card_gb (against the total),
    sglang util x (card_gb - resident_gb), resident_gb being what is on the card when the engine starts."""
    return util * (card_gb if _check(engine) == "vllm" else max(0.0, card_gb - resident_gb))


def budget_holds_activations(engine: str) -> bool:
    """True when the engine's activations and CUDA graphs come out of its budget (vLLM), False when they come on
    top of it, out of the memory the fraction leaves free (SGLang)."""
    return _check(engine) == "vllm"


def explain(engine: str, util: float, card_gb: float, resident_gb: float) -> str:
    """One sentence for the plan: what the budget is made of, with the numbers."""
    e = _check(engine)
    budget = static_budget_gb(e, util, card_gb, resident_gb)
    if e == "vllm":
        return (f"vLLM: gpu_memory_utilization {util:g} x {card_gb:g} GB card (total) = {budget:.2f} GB for its "
                f"weights, activations, CUDA graphs and KV cache")
    free = max(0.0, card_gb - resident_gb)
    return (f"SGLang: mem_fraction_static {util:g} x {free:.2f} GB free at engine start ({card_gb:g} GB card - "
            f"{resident_gb:.2f} GB already held) = {budget:.2f} GB for its weights and KV cache; its activations "
            f"and CUDA graphs come on top, out of the remaining {free - budget:.2f} GB "
            f"(the same value under vLLM would be {util * card_gb:.2f} GB of the total, activations included)")
