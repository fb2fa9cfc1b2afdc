"""What a micro-batch costs by its size: verl's update and log-prob passes with speed=fused at several token budgets.

    python3 benchmarks/gpu/budget_bench.py --out $OUT/budget_bench.json           # the 1.7B LoRA smoke's batch
    python3 benchmarks/gpu/budget_bench.py --size tiny --seqs 8 --response 64 --budgets 256,1024   # on a CPU

The same rollout batch (pass_bench.py's: SEQS answers, verl's own dynamic batching and forward_step, sdpa, packed) cut
at each budget, with activation checkpointing on and off: seconds of the update (forward + backward, no optimizer) and
of the old log-prob pass, micro-batches, and the card's peak allocated memory of each. Fewer micro-batches pay fewer
fixed costs; without flash-attn, sdpa attends over a whole packed micro-batch under a block-diagonal mask, whose work
grows with the square of its tokens. Which wins at which size is what this measures (issue 27,
benchmarks/gpu/README.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pass_bench import build, engine_for, micro_batches, run_pass  # noqa: E402


def peak_gb(dev: str) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 1e9, 2) if dev == "cuda" else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1_7b", help="0_6b, 1_7b, 4b (conf/model's Qwen3 shapes) or tiny")
    ap.add_argument("--lora-rank", type=int, default=64)
    ap.add_argument("--seqs", type=int, default=128, help="answers a step (smoke: 32 prompts x 4)")
    ap.add_argument("--prompt", type=int, default=35)
    ap.add_argument("--response", type=int, default=512)
    ap.add_argument("--budgets", default="3000,8192,16384", help="token budgets, comma-separated")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":  # verl names the device; on a CPU-only machine it is the CPU
        from verl.workers.engine.fsdp import transformer_impl
        transformer_impl.get_device_id = transformer_impl.get_device_name = lambda: "cpu"
    budgets = [int(b) for b in a.budgets.split(",")]
    res = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__,
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}, "rows": []}
    print(f"{res['device']}: Qwen3 {a.size}, LoRA r{a.lora_rank}, {a.seqs} answers of {a.prompt} + <= {a.response} "
          "tokens, speed=fused")
    for checkpointing in (True, False):
        model, cfg = build(a.size, a.lora_rank, True, dev, checkpointing=checkpointing)
        engine = engine_for(model, dev)
        for budget in budgets:
            batches = micro_batches(a.seqs, a.prompt, a.response, budget, cfg.vocab_size, dev)
            row = {"checkpointing": checkpointing, "budget": budget, "micro_batches": len(batches),
                   "tokens": sum(t for _, t in batches), "largest": max(t for _, t in batches)}
            for name, (entropy, train) in {"update": (True, True), "old_log_prob": (True, False)}.items():
                if dev == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                row[f"{name}_s"] = round(run_pass(engine, batches, True, entropy, train, dev), 3)
                row[f"{name}_peak_gb"] = peak_gb(dev)
            res["rows"].append(row)
            print(f"  checkpointing {'on ' if checkpointing else 'off'} budget {budget:>6}: {row['micro_batches']:>3} "
                  f"micro-batches (largest {row['largest']:,} tokens): update {row['update_s']:6.2f} s "
                  f"(peak {row['update_peak_gb']} GB), old log-prob {row['old_log_prob_s']:6.2f} s", flush=True)
        del model, engine
        if dev == "cuda":
            torch.cuda.empty_cache()
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
