"""Where a GRPO step's trainer time goes: py-spy samples of verl's worker process, by phase and by what ran.

    python3 benchmarks/gpu/pyspy_phases.py RAW [--rate 20] [--metrics metrics.jsonl]

RAW is `py-spy record --format raw` output (gzipped or not) of verl's WorkerDict process (speed_session.sh writes
one per Ray/vLLM process). A phase is the verl 0.9.1 worker method on the stack (compute_log_prob, update_actor, ...);
inside it, a sample counts for the first kind below whose frame it holds. py-spy leaves out threads that wait (on the
GPU, a lock, a socket), so the seconds are the Python thread's busy time, not wall time. With --metrics the job's
verl timers (timing_s/*, summed over its steps) are printed beside the sampled seconds.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

# (what ran, a frame marker): the first marker found in a sample's stack names it
KINDS = [
    ("log-prob row loop (logprobs_from_logits_v2)", "logprobs_from_logits_v2"),
    ("torch.compile (dynamo/inductor)", "torch/_dynamo/convert_frame.py"),
    ("torch.compile (dynamo/inductor)", "torch/_inductor/"),
    ("activation checkpointing's recompute (autograd thread)", "_checkpoint_hook"),
    ("entropy", "entropy_from_logits"),
    ("fused log-prob + entropy", "FusedLinearForPPO"),
    ("model forward", "forward_base_model"),
    ("model forward", "FullyShardedDataParallel.forward"),
    ("backward", "Tensor.backward"),
    ("optimizer step", "optimizer_step"),
    ("micro-batch split", "prepare_micro_batches"),
    ("FSDP parameter offload (to and from host memory)", "load_fsdp_model_to_gpu"),
    ("FSDP parameter offload (to and from host memory)", "offload_fsdp_model_to_cpu"),
    ("FSDP parameter offload (to and from host memory)", "_move_module_to_device"),
    ("padding removed and restored", "left_right_2_no_padding"),
    ("padding removed and restored", "no_padding_2_padding"),
    ("batch data movement", "TensorDictBase.to"),
    ("batch data movement", "index_select_tensor_dict"),
    ("imports (start-up)", "_find_and_load"),
]
PHASE_PREFIX = "ActorRolloutRefWorker."
TIMERS = {"compute_log_prob": "old_log_prob", "compute_ref_log_prob": "ref", "update_actor": "update_actor",
          "update_weights": "update_weights"}


def read_raw(path: Path) -> list[tuple[list[str], int]]:
    """(frames from the root, sample count) per line of py-spy's raw (collapsed-stack) format."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        rows = []
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit():
                rows.append((stack.split(";"), int(count)))
    return rows


def phase_of(frames: list[str]) -> str:
    """The verl worker method on the stack, or what the sample was outside one."""
    for fr in frames:
        if fr.startswith(PHASE_PREFIX):
            return fr[len(PHASE_PREFIX):].split(" ")[0]
    return "(outside a worker call)"


def kind_of(frames: list[str]) -> str:
    """The first KINDS marker found in the stack (the innermost calls are the most specific, so search all)."""
    for name, marker in KINDS:
        if any(marker in fr for fr in frames):
            return name
    return "other"


def attribute(rows: list[tuple[list[str], int]]) -> dict[str, Counter]:
    """{phase: Counter(kind -> samples)}."""
    out: dict[str, Counter] = defaultdict(Counter)
    for frames, n in rows:
        out[phase_of(frames)][kind_of(frames)] += n
    return dict(out)


def verl_timers(metrics: Path) -> dict[str, float]:
    """Each timing_s/* of the job's metrics.jsonl, summed over its steps."""
    total: Counter = Counter()
    for line in metrics.read_text().splitlines():
        for key, value in json.loads(line).get("data", {}).items():
            if key.startswith("timing_s/"):
                total[key[len("timing_s/"):]] += value
    return dict(total)


def report(table: dict[str, Counter], rate: float, timers: dict[str, float] | None = None) -> str:
    lines = []
    for phase, kinds in sorted(table.items(), key=lambda kv: -sum(kv[1].values())):
        busy = sum(kinds.values()) / rate
        timer = (timers or {}).get(TIMERS.get(phase, ""), None)
        lines.append(f"{phase}: {busy:.1f} s sampled" + (f" (verl's timing_s/{TIMERS[phase]}: {timer:.1f} s)"
                                                         if timer is not None else ""))
        for kind, n in kinds.most_common():
            lines.append(f"  {n / rate:7.1f} s  {100 * n / sum(kinds.values()):5.1f}%  {kind}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--rate", type=float, default=20.0, help="py-spy's --rate (samples a second)")
    ap.add_argument("--metrics", type=Path, help="the job's metrics.jsonl, for verl's own timers")
    args = ap.parse_args(argv)
    timers = verl_timers(args.metrics) if args.metrics else None
    print(report(attribute(read_raw(args.raw)), args.rate, timers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
