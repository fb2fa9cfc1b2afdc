"""Each phase's verdict with the calibration's margin (grpo_lab/memory/calibration.py, the recorded runs):
`phase_result`, the generation phase's verdict (vLLM must start), plan.json's `calibration` and `worst`."""

from __future__ import annotations

from typing import Any

from grpo_lab.memory.memplan_arch import Arch, Settings
from grpo_lab.memory.memplan_phases import (
    GB,
    engine_budget,
    generation_phase,
    host_ram,
    kv_cache,
    training_phase,
    verdict_of,
    weight_sync_phase,
)


def calibration_of(arch: Arch, s: Settings) -> dict[str, Any]:
    """plan.json's `calibration`: per verdict, the regime, whether a recorded run measured it, the margin used."""
    from grpo_lab.memory import (
        calibration,  # reads the calibration table once (benchmarks/gpu/memplan_calibration.json)
    )

    regime = calibration.regime_of(arch, s)
    out: dict[str, Any] = {ph: calibration.phase_calibration(regime, ph)
                           for ph in ("generation", "training", "weight_sync", "kv_cache")}
    out["host_ram"] = {"regime": regime, "measured": False, "margin": 0.0, "basis": "host_ram",
                       "note": "host RAM is not calibrated: compared with the RAM as planned (the kernel's OOM killer "
                               "ends a run without a Python error)"}
    out["table"] = calibration.TABLE_MD
    return out


def _exact_gb(arch: Arch, s: Settings, phase: str) -> float:
    """The part of a phase's peak known exactly: the engine's static budget in the generation phase (vLLM takes
    util x card, SGLang its fraction of the memory free at its start, whatever else the plan gets wrong)."""
    return engine_budget(arch, s)[0] / GB if phase == "generation" else 0.0


VERDICT_ORDER = {"fits": 0, "unknown": 0, "tight": 1, "oom": 2}


def worst(*verdicts: str) -> str:
    return max(verdicts, key=lambda v: VERDICT_ORDER.get(v, 0)) if verdicts else "fits"


def _margin(arch: Arch, s: Settings, phase: str) -> float:
    from grpo_lab.memory import calibration

    return calibration.phase_calibration(calibration.regime_of(arch, s), phase)["margin"]


def generation_verdict(arch: Arch, s: Settings, margin: float | None = None) -> str:
    kv = kv_cache(arch, s)
    if kv["tokens"] <= 0 or not kv["fits_max_model_len"]:
        return "oom"  # vLLM refuses to start: no KV cache, or not one max_model_len sequence
    m = _margin(arch, s, "generation") if margin is None else margin
    return verdict_of(generation_phase(arch, s)["peak_gb_per_gpu"], s.card_gb, m, _exact_gb(arch, s, "generation"))


def phase_result(arch: Arch, s: Settings, phase: str) -> tuple[float, str]:
    """(peak GB, verdict) of one phase ("generation", "training", "weight_sync", "host_ram")."""
    if phase == "generation":
        return generation_phase(arch, s)["peak_gb_per_gpu"], generation_verdict(arch, s)
    if phase not in ("training", "weight_sync"):
        h = host_ram(arch, s)
        return h["total_gb"], h["verdict"]
    peak = (training_phase if phase == "training" else weight_sync_phase)(arch, s)["peak_gb_per_gpu"]
    return peak, verdict_of(peak, s.card_gb, _margin(arch, s, phase))
