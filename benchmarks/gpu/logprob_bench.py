"""Seconds a step's token log-probs cost in verl 0.9.1 without flash-attn: the per-token loop against the fused kernel.

verl's actor turns the last hidden states of a packed micro-batch into per-token log-probs in one of two ways:
    unfused (use_fused_kernels=false): logits = h @ W^T, logits /= temperature, logprobs_from_logits (without flash-attn
        its row-by-row loop, logprobs_from_logits_v2), entropy_from_logits in the update;
    fused (use_fused_kernels=true): verl's FusedLinearForPPO (torch backend, chunks of 512 tokens).
This times both on the model shapes grpo-lab runs, for one pass of TOKENS tokens in micro-batches of MICRO, forward
alone (old log-prob, reference) and forward + backward (update), and prints the ratio. On the GPU test machine:

    python3 benchmarks/gpu/logprob_bench.py --out $OUT/logprob_bench.json
"""
import argparse
import json

import torch
from pass_bench import seconds_after_warmup  # beside this file (python3 benchmarks/gpu/logprob_bench.py)
from verl.utils.experimental.torch_functional import FusedLinearForPPO
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

SHAPES = {"smollm2_135m": (576, 49152), "qwen3_0_6b": (1024, 151936), "qwen3_1_7b": (2048, 151936)}


def unfused(h, w, ids, entropy):
    logits = (h @ w.T) / 1.0
    lp = logprobs_from_logits(logits, ids)
    return lp, entropy_from_logits(logits) if entropy else None


KERNEL = FusedLinearForPPO(chunk_size=512)  # verl's default chunk size


def fused(h, w, ids, entropy):
    return KERNEL(h, w, ids, 1.0)


def timed(fn, h, w, ids, train: bool, passes: int, dev: str) -> float:
    def once():
        for _ in range(passes):
            hh = h.detach().requires_grad_(train)
            with torch.set_grad_enabled(train):
                lp, ent = fn(hh, w, ids, train)
                if train:
                    (lp.sum() + (0 if ent is None else 0.0 * ent.sum())).backward()
    return seconds_after_warmup(once, dev)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=100_000, help="tokens of one pass (learn_smollm2: ~100k a step)")
    ap.add_argument("--micro", type=int, default=4096, help="tokens per micro-batch (the passes' token budgets)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", help="write the numbers here as JSON")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for name in a.shapes.split(","):
        hidden, vocab = SHAPES[name]
        g = torch.Generator(device=dev).manual_seed(0)
        h = torch.randn(a.micro, hidden, device=dev, dtype=torch.bfloat16, generator=g)
        w = (torch.randn(vocab, hidden, device=dev, dtype=torch.bfloat16, generator=g) * 0.02).requires_grad_(True)
        ids = torch.randint(0, vocab, (a.micro,), device=dev, generator=g)
        lp_u, _ = unfused(h, w, ids, False)
        lp_f, _ = fused(h, w, ids, False)
        passes = max(1, a.tokens // a.micro)
        row = {"shape": name, "hidden": hidden, "vocab": vocab, "micro": a.micro, "tokens": passes * a.micro,
               "max_abs_diff": float((lp_u.detach().float() - lp_f.detach().float()).abs().max())}
        for train in (False, True):
            tag = "update" if train else "log_prob"
            row[f"{tag}_unfused_s"] = timed(unfused, h, w, ids, train, passes, dev)
            row[f"{tag}_fused_s"] = timed(fused, h, w, ids, train, passes, dev)
            row[f"{tag}_ratio"] = row[f"{tag}_unfused_s"] / row[f"{tag}_fused_s"]
        rows.append(row)
        print(f"{name:14s} {row['tokens']:,} tokens in {passes} micro-batches of {a.micro}: "
              f"log-prob {row['log_prob_unfused_s']:.2f} s unfused / {row['log_prob_fused_s']:.2f} s fused "
              f"= {row['log_prob_ratio']:.1f}x; update {row['update_unfused_s']:.2f} / {row['update_fused_s']:.2f} s "
              f"= {row['update_ratio']:.1f}x; |log-prob diff| <= {row['max_abs_diff']:.3g}", flush=True)
    result = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__,
              "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
