"""Rules on emulation (a smaller card rehearsed on a bigger one, grpo_lab/memory/emulate.py): say plainly that the run is
emulated and what vLLM and torch really get; refuse what emulation cannot do.

The rule `emulation` asks the one transform (emulate.emulate) what it makes of the checked config, so the note is
what the launcher's emulate stage does. At launch that stage has already refused what emulation cannot take; the
rule's error is for the preflight run on its own (make fit, a composed config)."""

from __future__ import annotations

from typing import Iterable

from grpo_lab.memory import emulate
from grpo_lab.checks.rules import Ctx, Problem, error, note, rule


@rule("emulation", kind="emulation", phase="start-up")
def emulation(c: Ctx) -> Iterable[Problem]:
    try:
        done = emulate.emulate(c.verl, c.lab, c.environ)
    except emulate.EmulationError as e:
        yield error(str(e))
        return
    if done.settings is not None:
        yield note(emulate.describe(done))


@rule("emulation_torch", kind="emulation", phase="start-up", launching_only=True)
def emulation_torch(c: Ctx) -> Iterable[Problem]:
    try:
        if emulate.settings(c.lab) is None:
            return
    except emulate.EmulationError:
        return  # the rule above says what is wrong
    knows = emulate.torch_knows_fraction_key()
    if knows is None:
        yield note("emulation: no CUDA build of torch here, so whether its allocator knows "
                   "PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction was not checked")
    elif not knows:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("torch")
        except PackageNotFoundError:
            v = "?"
        yield error(f"emulation caps each worker with PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:..., but "
                    f"this torch ({v}) does not know that key: every worker would fail at its first CUDA allocation "
                    f"(\"Unrecognized CachingAllocator option\" / \"Unrecognized key\"). Install the torch "
                    f"verl[vllm]==0.9.1 pins (2.11: make setup), or run without emulation: "
                    f"lab.hardware.emulate.real_gpu_memory_gb=null")
