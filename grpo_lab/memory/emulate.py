"""Rehearse a smaller card on a bigger one: plan for the small card, cap each torch process, shrink vLLM's budget.

Pure on plain dicts (the input is left as it is); raises EmulationError with the fix for bad input (the launcher
turns it into its refusal). How a hardware option turns it on (lab.hardware.emulate.real_gpu_memory_gb beside
lab.hardware.gpu_memory_gb), what the transform changes and what the per-process cap does and does not see:
docs/emulation.md.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab import facts
from grpo_lab.cli.apply import Change, apply_overrides
from grpo_lab.labconf import Lab
from grpo_lab.memory.verl_view import VerlView
from grpo_lab.verl_keys import A

ENV_VARS = facts.RAY_ENV_VARS  # what verl hands its Ray workers
ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # the name torch 2.11 reads first, then the new one
FRACTION_KEY = "per_process_memory_fraction"
UTIL_KEY = "gpu_memory_utilization"


class EmulationError(ValueError):
    """Bad emulation input: what is wrong, the numbers, the override that fixes it."""


@dataclass(frozen=True)
class Emulation:
    card_gb: float  # the card planned for (lab.hardware.gpu_memory_gb)
    real_gb: float  # the card the job runs on (lab.hardware.emulate.real_gpu_memory_gb)
    name: str = ""
    real_name: str = ""

    @property
    def fraction(self) -> float:
        return self.card_gb / self.real_gb

    def scale(self, util: float) -> float:
        """A fraction of the small card as a fraction of the real one (vLLM: util x TOTAL memory)."""
        return round(float(util) * self.fraction, 6)


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def settings(lab: Lab) -> Emulation | None:
    """The emulation the `lab` facts ask for, checked; None when lab.hardware.emulate.real_gpu_memory_gb is unset."""
    hw = lab.hardware  # typed (grpo_lab/labconf.py): numbers or None
    real, card = hw.emulate.real_gpu_memory_gb, hw.gpu_memory_gb
    if real is None:
        return None
    if real <= 0:
        raise EmulationError(f"lab.hardware.emulate.real_gpu_memory_gb={real:g} is not a size in GB: set it to the "
                             f"memory of the cards the job runs on, e.g. lab.hardware.emulate.real_gpu_memory_gb=139.8 "
                             f"(H200) or =80 (A100 80GB), or drop it to run without emulation")
    if card is None or card <= 0:
        raise EmulationError(f"emulation on {real:g} GB cards needs the card to plan for: set "
                             f"lab.hardware.gpu_memory_gb, e.g. lab.hardware.gpu_memory_gb=32")
    if card > real:
        raise EmulationError(f"cannot emulate a {card:g} GB card on {real:g} GB cards (the cap would be "
                             f"{card / real:.3f} of the card, over 1): emulation only rehearses a smaller card. Set "
                             f"lab.hardware.gpu_memory_gb={real:g} (no emulation) or "
                             f"lab.hardware.emulate.real_gpu_memory_gb to the real card's size")
    return Emulation(float(card), float(real), str(hw.gpu_name or ""), str(hw.emulate.real_gpu_name or ""))


# ---- the allocator string: "key:value,key:value" (roundup_power2_divisions takes a [..] list with commas) ----

def parse_alloc_conf(text: str) -> list[tuple[str, str]]:
    """[(key, value)] of an allocator config string, in order; a value may be a [...] list."""
    depth = itertools.accumulate((ch == "[") - (ch == "]") for ch in text)  # inside [..] after each character
    cuts = [i for i, (ch, d) in enumerate(zip(text, depth)) if ch == "," and d == 0]
    items = [text[a + 1:b] for a, b in itertools.pairwise([-1, *cuts, len(text)])]
    out = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        key, sep, value = item.partition(":")
        if not sep:
            raise EmulationError(f"allocator setting {item!r} in {text!r} has no value: torch reads key:value pairs "
                                 f"separated by commas, e.g. expandable_segments:False,max_split_size_mb:512")
        out.append((key.strip(), value.strip()))
    return out


def merge_alloc_conf(user: str | None, fraction: float) -> str:
    """The user's allocator string with the fraction added, unless it has its own (the user's is kept)."""
    pairs = parse_alloc_conf(user or "")
    if not any(k == FRACTION_KEY for k, _ in pairs):
        pairs.append((FRACTION_KEY, f"{fraction:.6g}"))
    return ",".join(f"{k}:{v}" for k, v in pairs)


def worker_env(emu: Emulation, env: Mapping[str, Any], environ: Mapping[str, str],
               cfg: VerlView) -> dict[str, str]:
    """The variables emulation adds to verl's Ray workers; `env` is what the job already hands them.
    PYTORCH_CUDA_ALLOC_CONF always (torch 2.11 reads it first); PYTORCH_ALLOC_CONF too when the user set it, with the
    same value, so that whichever name a torch reads first carries the cap."""
    # the user's allocator string: the job's env_vars first (they override the shell's in Ray's workers), then the
    # shell; PYTORCH_CUDA_ALLOC_CONF before PYTORCH_ALLOC_CONF, the order torch reads them
    user = next((str(src[var]) for var in ALLOC_VARS for src in (env, environ) if src.get(var) not in (None, "")), None)
    merged = merge_alloc_conf(user, emu.fraction)
    expandable = any(k == "expandable_segments" and v == "True" for k, v in parse_alloc_conf(merged))
    if cfg.rollout.enable_sleep_mode and expandable:
        raise EmulationError(f"your allocator setting {user!r} turns expandable_segments on; emulation hands it to "
                             f"vLLM's processes in PYTORCH_CUDA_ALLOC_CONF, and vLLM's sleep mode refuses that "
                             f"(vllm/device_allocator/cumem.py: 'Expandable segments are not compatible with memory "
                             f"pool'). Drop expandable_segments:True from it (verl turns it on and off itself around "
                             f"the weight sync)")
    out = {"PYTORCH_CUDA_ALLOC_CONF": merged}
    if env.get("PYTORCH_ALLOC_CONF") or environ.get("PYTORCH_ALLOC_CONF"):
        out["PYTORCH_ALLOC_CONF"] = merged
    return out


def utilizations(d: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """(key, value) of each gpu_memory_utilization the config sets to a number."""
    if isinstance(d, Mapping):
        for k, v in d.items():
            p = f"{path}.{k}" if path else str(k)
            if k == UTIL_KEY and _number(v) is not None:
                yield p, float(v)
            else:
                yield from utilizations(v, p)


@dataclass(frozen=True)
class Emulated:
    """What `emulate` makes of a config. Without emulation `planned` and `verl` are the input itself."""

    planned: dict[str, Any]  # what the preflight plans: utilizations as typed (of the small card), the workers capped
    info: dict[str, Any] | None = None  # plan.json's "emulation" section; None without emulation
    settings: Emulation | None = None
    scaled: tuple[Change, ...] = ()  # what verl gets instead: each utilization scaled to the real card

    @functools.cached_property
    def verl(self) -> dict[str, Any]:
        """What verl gets: `planned` with the `scaled` changes applied, in a copy that shares nothing with it (made
        when first asked for: the preflight's rule only describes)."""
        if self.info is None:
            return self.planned
        return apply_overrides(self.planned, Lab(), self.scaled)[0]


def emulate(config: dict[str, Any], lab: Lab, environ: Mapping[str, str]) -> Emulated:
    """The config for an emulated smaller card, as planned and as verl gets it (see the module doc), and the plan's
    record of it. Raises EmulationError for input emulation cannot take; `config` is left as it is."""
    emu = settings(lab)
    if emu is None:
        return Emulated(config)
    cfg = VerlView.of(config)
    env = dict(cfg.env_vars)
    env.update(worker_env(emu, env, environ, cfg))
    engine = str(cfg.rollout.name).lower()
    if engine != "vllm":
        raise EmulationError(f"emulation scales vLLM's gpu_memory_utilization (a fraction of the card's total); "
                             f"{engine} reads it as a fraction of the memory free at start, which emulation cannot "
                             f"scale. Use actor_rollout_ref.rollout.name=vllm, or run {engine} without emulation")
    scaled = {path: {"planned": util, "handed_to_engine": emu.scale(util),
                     # of the card's real bytes (its number is GiB, as CUDA reports it), as the memory plan's
                     "budget_gb": round(util * emu.card_gb * 2**30 / 1e9, 2)}
              for path, util in utilizations(config)}
    info = {
        "emulated": True,
        "card": f"{emu.name or f'{emu.card_gb:g} GB card'} ({emu.card_gb:g} GB)",
        "real_card": f"{emu.real_name or 'the real card'} ({emu.real_gb:g} GB)",
        "card_gb": emu.card_gb,
        "real_gpu_memory_gb": emu.real_gb,
        "fraction": round(emu.fraction, 6),
        "torch_cap_gb_per_process": round(emu.fraction * emu.real_gb, 2),
        "gpu_memory_utilization": scaled,
        "worker_env": {k: env[k] for k in (*ALLOC_VARS, "NCCL_P2P_DISABLE") if k in env},
    }
    capped = Change(ENV_VARS, env, reason=f"emulation: each torch process capped at {emu.fraction:.3f} of the card")
    scaled = tuple(Change(path, u["handed_to_engine"], reason=f"emulation: {u['planned']:g} of a {emu.card_gb:g} GB "
                          f"card as a fraction of the real {emu.real_gb:g} GB") for path, u in scaled.items())
    return Emulated(apply_overrides(config, lab, [capped])[0], info, emu, scaled)


def describe(done: Emulated) -> str:
    """One paragraph for the preflight's notes: the run is emulated, and the real values vLLM and torch get; "" without
    emulation."""
    emu, info = done.settings, done.info
    if emu is None or info is None:
        return ""
    conf = info["worker_env"]["PYTORCH_CUDA_ALLOC_CONF"]
    cap = float(dict(parse_alloc_conf(conf)).get(FRACTION_KEY, emu.fraction))
    own = (f" (your own {FRACTION_KEY}, kept; emulation's would be {emu.fraction:.6g})"
           if abs(cap - emu.fraction) > 1e-6 else "")
    utils = "; ".join(f"{path.split('.')[-2]}.{UTIL_KEY} {u['planned']:g} of {emu.card_gb:g} GB = "
                      f"{u['planned'] * emu.card_gb:.2f} GB -> {u['handed_to_engine']:g} of {emu.real_gb:g} GB"
                      for path, u in info["gpu_memory_utilization"].items() if path.startswith(A))
    names = [f" ({n})" if n else "" for n in (emu.name, emu.real_name)]
    return (f"EMULATED: planned for {emu.card_gb:g} GB cards{names[0]}, running on {emu.real_gb:g} GB cards{names[1]}. "
            f"Handed to vLLM: {utils}. Handed to torch in every Ray worker: "
            f"PYTORCH_CUDA_ALLOC_CONF={conf}{own} = {cap * emu.real_gb:.2f} GB per process "
            f"(grpo_lab/memory/emulate.py)")


# ---- does this machine's torch know the key? (an unknown key is an error at the first CUDA allocation) ----

@functools.cache
def torch_knows_fraction_key() -> bool | None:
    """True/False: torch's CUDA library has (not) the per_process_memory_fraction parser; None: no CUDA torch here
    (a CPU build, or no torch). Reads libc10_cuda.so's bytes; torch is not imported."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        for lib in sorted(Path(loc, "lib").glob("libc10_cuda*.so*")):
            with contextlib.suppress(OSError):  # an unreadable library: the next one
                return b"per_process_memory_fraction" in lib.read_bytes()
    return None
