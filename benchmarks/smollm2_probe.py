"""Which synthetic task and prompt give GRPO a signal on SmolLM2-135M-Instruct? A CPU probe with transformers.

    python -m grpo_lab.tasks.smollm2 --out data/smollm2-135m-instruct        # make smollm2 (once)
    python benchmarks/smollm2_probe.py [--model DIR] [--prompts 32] [--samples 4] \\
        [--out benchmarks/smollm2_probe.json]

For each task x prompt style of grpo_lab.tasks.arith, on the first --prompts test problems (seed 0): one greedy answer
and --samples answers at the configuration's temperature (GRPO's rollout draws at
actor_rollout_ref.rollout.temperature, 1 by default), max --max-new-tokens (48) new tokens, stopping at <|im_end|>,
rendered with the model's chat template as verl renders them. Each answer is scored by
grpo_lab/tasks/rewards/strict_format.py (the reward the presets use). Reported per configuration:
  greedy_acc     share of greedy answers right in the "#### n" format (what validation reports)
  sampled_acc    share of sampled answers right
  formatted      share of sampled answers with a "#### n" line
  mixed_acc      share of prompts whose samples are some right, some wrong (non-zero GRPO advantage on acc)
  mixed_score    share of prompts whose samples do not all get the same score (non-zero advantage on the reward)
Deterministic (torch.manual_seed per configuration); about 5 minutes per configuration on 2 busy CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_lab.tasks import arith  # noqa: E402
from grpo_lab.tasks.rewards.strict_format import compute_score  # noqa: E402

# (task, style, sampling temperature)
CONFIGS = [("mixed", "gsm8k", 1.0), ("sums", "oneshot", 1.0), ("mixed", "oneshot", 1.0), ("mixed", "oneshot", 0.7),
           ("chain", "oneshot", 0.7)]


def generate(model, tok, prompts: list[str], samples: int, greedy: bool, max_new: int, batch: int,
             temperature: float = 1.0) -> list[list[str]]:
    import torch

    out: list[list[str]] = []
    per = max(1, batch // (1 if greedy else samples))  # prompts per generate call: about `batch` sequences
    for i in range(0, len(prompts), per):
        enc = tok(prompts[i:i + per], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_new, do_sample=not greedy,
                                 temperature=None if greedy else temperature, top_p=None, top_k=None,
                                 num_return_sequences=1 if greedy else samples,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        k = 1 if greedy else samples
        out += [texts[j:j + k] for j in range(0, len(texts), k)]
    return out


def probe(model, tok, task: str, style: str, n: int, samples: int, max_new: int, batch: int,
          temperature: float) -> dict:
    import torch

    rows = arith.rows(task, style, n_train=1, n_test=n, seed=0)["test"]
    prompts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False, enable_thinking=False)
               for r in rows]
    truth = [r["reward_model"]["ground_truth"] for r in rows]
    torch.manual_seed(0)
    t0 = time.perf_counter()
    greedy = generate(model, tok, prompts, 1, True, max_new, batch)
    sampled = generate(model, tok, prompts, samples, False, max_new, batch, temperature)
    src = f"arith_{task}_{style}"
    g = [compute_score(src, a[0], t) for a, t in zip(greedy, truth)]
    s = [[compute_score(src, x, t) for x in group] for group, t in zip(sampled, truth)]
    flat = [x for group in s for x in group]
    return {
        "task": task, "style": style, "temperature": temperature, "prompts": n, "samples": samples,
        "greedy_acc": sum(x["acc"] for x in g) / n,
        "greedy_formatted": sum(x["formatted"] for x in g) / n,
        "sampled_acc": sum(x["acc"] for x in flat) / len(flat),
        "formatted": sum(x["formatted"] for x in flat) / len(flat),
        "mixed_acc": sum(0 < sum(x["acc"] for x in grp) < len(grp) for grp in s) / n,
        "mixed_score": sum(len({x["score"] for x in grp}) > 1 for grp in s) / n,
        "seconds": round(time.perf_counter() - t0, 1),
        "example_prompt": rows[0]["prompt"][0]["content"],
        "examples": [{"truth": truth[i], "greedy": greedy[i][0][:200], "sampled": sampled[i][0][:200]}
                     for i in range(3)],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / "data/smollm2-135m-instruct"))
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--config", action="append", help="task:style:temperature (repeatable; default: CONFIGS)")
    p.add_argument("--out", default=str(ROOT / "benchmarks/smollm2_probe.json"))
    args = p.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        print(f"error: no model in {args.model}: make it with `make smollm2`", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    configs = [(c.split(":")[0], c.split(":")[1], float(c.split(":")[2])) for c in args.config] if args.config \
        else CONFIGS
    results = []
    for task, style, temp in configs:
        r = probe(model, tok, task, style, args.prompts, args.samples, args.max_new_tokens, args.batch, temp)
        results.append(r)
        Path(args.out).write_text(json.dumps({"results": results}, indent=2) + "\n")  # partial results as they come
        print(f"{task:6s} {style:8s} T={temp} greedy_acc {r['greedy_acc']:.3f}  sampled_acc {r['sampled_acc']:.3f}  "
              f"formatted {r['formatted']:.3f}  mixed_acc {r['mixed_acc']:.3f}  mixed_score {r['mixed_score']:.3f}  "
              f"({r['seconds']} s)", flush=True)
    meta = {"model": args.model, "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "max_new_tokens": args.max_new_tokens}
    Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
