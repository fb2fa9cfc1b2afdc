"""What a micro-batch costs by its size: verl's update and log-prob passes with speed=fused at several token budgets.

    python3 benchmarks/gpu/budget_bench.py --out $OUT/budget_bench.json           # the 1.7B LoRA smoke's batch
    python3 benchmarks/gpu/budget_bench.py --size tiny --seqs 8 --response 64 --budgets 256,1024   # on a CPU
    python3 benchmarks/gpu/budget_bench.py --profile 16384 --out $OUT/budget_bench.json   # and torch's profiler on
                                                                 # one update at that budget: the kernels it ran

The same rollout batch (pass_bench.py's: SEQS answers, verl's own dynamic batching and forward_step, sdpa) cut at
each budget, with activation checkpointing on and off, packed (verl's use_remove_padding, the presets') and padded
(use_remove_padding=false: each micro-batch padded to its longest answer): seconds of the update (forward + backward,
no optimizer) and of the old log-prob pass, micro-batches, and the card's peak allocated memory of each. Fewer
micro-batches pay fewer fixed costs; without flash-attn, sdpa attends over a whole packed micro-batch under a
block-diagonal mask, whose work grows with the square of its tokens; padded, each answer attends only to itself, at the
price of the padding. Which wins at which size is what this measures (issue 27, benchmarks/gpu/README.md).
--profile BUDGET adds torch.profiler over one packed update at that budget (checkpointing on): the operators and
kernels that took the card's time over two updates, the top 25 by self device time, into the JSON as "profile".
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pass_bench import batch_args, build, device, engine_for, micro_batches, run_pass  # noqa: E402


def peak_gb(dev: str) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 1e9, 2) if dev == "cuda" else None


def padded(td) -> int:
    """Tokens the model runs on for a micro-batch padded to its longest answer (rows x longest)."""
    lengths = td["input_ids"].offsets().diff()
    return int(lengths.numel() * lengths.max())


def profile_update(engine, batches, dev: str, top: int = 25) -> list[dict]:
    """Two updates (run_pass's warm-up and timed one; the row before warmed the shapes) under torch.profiler: the
    operators by self device time (CPU time on a CPU)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=acts) as prof:
        run_pass(engine, batches, True, True, True, dev)
    key = "self_device_time_total" if dev == "cuda" else "self_cpu_time_total"
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:top]
    return [{"name": e.key[:120], "calls": e.count, "self_s": round(getattr(e, key) / 1e6, 4)} for e in rows]


def main(argv: list[str] | None = None) -> int:
    ap = batch_args(__doc__)
    ap.add_argument("--budgets", default="3000,8192,16384", help="token budgets, comma-separated")
    ap.add_argument("--layouts", default="packed,padded", help="packed (use_remove_padding), padded, or both")
    ap.add_argument("--profile", type=int, default=0, help="a budget to profile one update at (0: none)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    dev = device()
    budgets = [int(b) for b in a.budgets.split(",")]
    res = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__,
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}, "rows": []}
    print(f"{res['device']}: Qwen3 {a.size}, LoRA r{a.lora_rank}, {a.seqs} answers of {a.prompt} + <= {a.response} "
          "tokens, speed=fused")
    for checkpointing in (True, False):
        model, cfg = build(a.size, a.lora_rank, True, dev, checkpointing=checkpointing)
        engine = engine_for(model, dev)
        for layout, budget in [(lay, b) for lay in a.layouts.split(",") for b in budgets]:
            batches = micro_batches(a.seqs, a.prompt, a.response, budget, cfg.vocab_size, dev,
                                    remove_padding=layout == "packed")
            row = {"checkpointing": checkpointing, "layout": layout, "budget": budget, "micro_batches": len(batches),
                   "tokens": sum(t for _, t in batches), "largest": max(t for _, t in batches),
                   "padded_tokens": sum(padded(td) for td, _ in batches)}
            for name, (entropy, train) in {"update": (True, True), "old_log_prob": (True, False)}.items():
                if dev == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                try:
                    row[f"{name}_s"] = round(run_pass(engine, batches, True, entropy, train, dev), 3)
                except torch.OutOfMemoryError:  # kept as a row: this budget does not fit the card this way
                    row[f"{name}_s"] = None
                    engine.module.zero_grad(set_to_none=True)
                    torch.cuda.empty_cache()
                row[f"{name}_peak_gb"] = peak_gb(dev)
            res["rows"].append(row)
            if a.out:  # as it goes: a later row that takes the process down loses nothing before it
                a.out.write_text(json.dumps(res, indent=1) + "\n")
            if checkpointing and layout == "packed" and budget == a.profile:
                res["profile"] = profile_update(engine, batches, dev)
                total = sum(r["self_s"] for r in res["profile"])
                print(f"  profile, budget {budget}: the top {len(res['profile'])} operators, {total:.2f} s of "
                      "self time over two updates")
                for r in res["profile"]:
                    print(f"    {r['self_s']:8.3f} s {r['calls']:>7} x {r['name']}")
            secs = {k: "out of memory" if row[k] is None else f"{row[k]:.2f} s" for k in ("update_s", "old_log_prob_s")}
            print(f"  checkpointing {'on ' if checkpointing else 'off'} {layout} budget {budget:>6}: "
                  f"{row['micro_batches']:>3} micro-batches (largest {row['largest']:,} tokens, "
                  f"{row['padded_tokens']:,} with padding): update {secs['update_s']} "
                  f"(peak {row['update_peak_gb']} GB), old log-prob {secs['old_log_prob_s']}", flush=True)
        del model, engine
        if dev == "cuda":
            torch.cuda.empty_cache()
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
