"""Each phase's verdict with the calibration's margin (grpo_lab/memory/calibration.py, the recorded runs): `verdict_of`,
`judge` (a configuration's verdicts), `assess` and `worst`."""

from __future__ import annotations

from typing import Any

from grpo_lab.memory import calibration
from grpo_lab.memory.memplan_arch import Arch, Settings
from grpo_lab.memory.memplan_phases import TIGHT_FRACTION, Phases

PHASES = ("generation", "training", "weight_sync", "host_ram")
VERDICT_ORDER = {"fits": 0, "unknown": 0, "tight": 1, "oom": 2}


def verdict_of(peak_gb: float, capacity_gb: float, margin: float = 0.0, exact_gb: float = 0.0) -> str:
    """`oom` when even the plan's largest measured overshoot (`margin`, grpo_lab/memory/calibration.py) leaves the peak
    above the capacity (`exact_gb`: the part of the peak that is known exactly and carries no margin); `tight`
    above TIGHT_FRACTION of it or above it within the margin; else `fits`."""
    if capacity_gb <= 0:
        return "unknown"
    if exact_gb + (peak_gb - exact_gb) / (1.0 + margin) > capacity_gb:
        return "oom"
    if peak_gb > TIGHT_FRACTION * capacity_gb:
        return "tight"
    return "fits"


def worst(*verdicts: str) -> str:
    return max(verdicts, key=lambda v: VERDICT_ORDER.get(v, 0)) if verdicts else "fits"



def verdict(ph: Phases, phase: str, cal: dict[str, Any]) -> str:
    """One phase's verdict. Generation is `oom` where vLLM refuses to start (no KV cache, or not one max_model_len
    sequence); its engine's static budget is known exactly and carries no margin."""
    s = ph.s
    if phase == "host_ram":
        return verdict_of(ph.peak_gb(phase), float(s.host_ram_gb or 0))
    if phase == "generation":
        if ph.kv["tokens"] <= 0 or not ph.kv["fits_max_model_len"]:
            return "oom"
        return verdict_of(ph.peak_gb(phase), s.card_gb, cal[phase]["margin"], ph.exact_generation_gb)
    return verdict_of(ph.peak_gb(phase), s.card_gb, cal[phase]["margin"])


def judge(ph: Phases, cal: dict[str, Any]) -> dict[str, str]:
    """Each phase's verdict and the overall one."""
    out = {p: verdict(ph, p, cal) for p in PHASES}
    out["overall"] = worst(*out.values())
    return out


def assess(arch: Arch, s: Settings) -> tuple[Phases, dict[str, str]]:
    """One configuration's phases and their verdicts."""
    ph = Phases(arch, s)
    return ph, judge(ph, calibration.calibration_of(arch, s))
