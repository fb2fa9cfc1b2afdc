"""Supervised warm-up of a (tiny) model on GSM8K-format rows, so that GRPO afterwards has rewards to learn from.

    python -m grpo_lab.tasks.tiny --out data --variant learn
    python -m grpo_lab.tasks.warmup --model data/tiny-qwen3-learn --data data/arith_tiny --out data/tiny-qwen3-sft \\
        --steps 400 --device cuda

Why, what it trains on, what it measures, and the measured numbers: docs/tasks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

METRICS_FILE = "grpo_lab_warmup.json"
SYNTHETIC_ROWS = 20000  # --synthetic's default: fresh problems to train on


def load_rows(data_dir: str | os.PathLike, split: str) -> list[dict]:
    """[{messages, answer, ground_truth}] from DATA/{split}.parquet (verl's GSM8K row format)."""
    import pyarrow.parquet as pq

    path = Path(data_dir) / f"{split}.parquet"
    if not path.is_file():
        raise SystemExit(f"error: {path} not found (make it with `make tiny`, or "
                         "`python -m grpo_lab.tasks.data gsm8k`)")
    rows = []
    for i, row in enumerate(pq.read_table(path).to_pylist()):
        extra = row.get("extra_info") or {}
        if "answer" not in extra:
            raise SystemExit(f"error: {path} row {i} has no extra_info.answer to learn from")
        rows.append({"messages": list(row["prompt"]), "answer": extra["answer"],
                     "ground_truth": row["reward_model"]["ground_truth"]})
    if not rows:
        raise SystemExit(f"error: {path} has no rows")
    return rows


def synthetic_rows(n: int, seed: int, exclude: list[dict]) -> list[dict]:
    """n arithmetic problems from grpo_lab.tasks.tiny's generator whose prompts are not among exclude's."""
    from grpo_lab.tasks.data import gsm8k_row
    from grpo_lab.tasks.tiny import arith_records

    seen = {m["content"] for r in exclude for m in r["messages"] if m["role"] == "user"}
    rows = []
    for rec in arith_records(n + len(seen), seed + 1000):
        row = gsm8k_row(rec["question"], rec["answer"], "train", len(rows))
        if row["prompt"][0]["content"] not in seen:
            rows.append({"messages": row["prompt"], "answer": rec["answer"],
                         "ground_truth": row["reward_model"]["ground_truth"]})
            if len(rows) == n:
                break
    return rows


class Encoder:
    def __init__(self, tokenizer, enable_thinking: bool):
        self.tok = tokenizer
        self.chat_kwargs = {"enable_thinking": enable_thinking}
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id

    def prompt(self, messages: list[dict]) -> list[int]:
        # return_dict=False: the ids as a list (transformers 5 returns a BatchEncoding by default)
        return self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False,
                                            **self.chat_kwargs)

    def examples(self, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
        """(input ids, labels) per row: labels -100 on the prompt. The same ids as prompt() + encode(answer)."""
        texts = self.tok.apply_chat_template([r["messages"] for r in rows], add_generation_prompt=True,
                                             tokenize=False, **self.chat_kwargs)
        prompts = self.tok(texts, add_special_tokens=False)["input_ids"]
        answers = self.tok([r["answer"] for r in rows], add_special_tokens=False)["input_ids"]
        return [(p + a + [self.eos_id], [-100] * len(p) + a + [self.eos_id]) for p, a in zip(prompts, answers)]


def _padded(seqs: list[list[int]], value: int, device, side: str = "right"):
    import torch
    from torch.nn.utils.rnn import pad_sequence

    return pad_sequence([torch.tensor(s, dtype=torch.long) for s in seqs], batch_first=True, padding_value=value,
                        padding_side=side).to(device)


def _batch(examples: list[tuple[list[int], list[int]]], pad_id: int, device):
    xs, ys = [x for x, _ in examples], [y for _, y in examples]
    return _padded(xs, pad_id, device), _padded(ys, -100, device), _padded([[1] * len(x) for x in xs], 0, device)


def evaluate(model, enc: Encoder, rows: list[dict], device, max_new_tokens: int = 48, samples: int = 4,
             batch_size: int = 64, seed: int = 0) -> dict:
    """Greedy and sampled (temperature 1) accuracy on rows, scored by verl's gsm8k compute_score."""
    import torch
    from verl.utils.reward_score.gsm8k import compute_score

    model.eval()
    greedy_right, sampled_right, signal, formatted = 0, 0, 0, 0
    example = ""
    torch.manual_seed(seed)
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        prompts = [enc.prompt(r["messages"]) for r in chunk]
        width = max(map(len, prompts))
        ids = _padded(prompts, enc.pad_id, device, "left")  # left padding for generation
        mask = _padded([[1] * len(p) for p in prompts], 0, device, "left")
        common = dict(attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=enc.pad_id,
                      eos_token_id=[enc.eos_id, enc.pad_id])
        with torch.no_grad():
            greedy = model.generate(ids, do_sample=False, **common)
            drawn = None
            if samples > 0:
                drawn = model.generate(ids.repeat_interleave(samples, 0), do_sample=True, temperature=1.0,
                                       top_k=0, top_p=1.0,
                                       **{**common, "attention_mask": mask.repeat_interleave(samples, 0)})
        for i, row in enumerate(chunk):
            text = enc.tok.decode(greedy[i, width:], skip_special_tokens=True)
            example = example or text
            greedy_right += compute_score(text, row["ground_truth"]) == 1.0
            formatted += "#### " in text
            if drawn is not None:
                scores = [compute_score(enc.tok.decode(drawn[i * samples + k, width:], skip_special_tokens=True),
                                        row["ground_truth"]) == 1.0 for k in range(samples)]
                sampled_right += sum(scores)
                signal += 0 < sum(scores) < samples
    n = len(rows)
    out = {"n": n, "greedy_acc": greedy_right / n, "format_rate": formatted / n, "example": example}
    if samples > 0:
        out.update(samples=samples, sampled_acc=sampled_right / (n * samples), mixed_groups=signal / n)
    return out


def _fmt(m: dict) -> str:
    s = f"greedy acc {m['greedy_acc']:.3f} (format {m['format_rate']:.2f})"
    if "sampled_acc" in m:
        s += f", sampled acc {m['sampled_acc']:.3f}, prompts with mixed draws {m['mixed_groups']:.2f}"
    return s + f" on {m['n']} test prompts; e.g. {m['example']!r}"


def warmup(model_dir: str, data_dir: str, out_dir: str, steps: int, device: str = "cuda", batch_size: int = 128,
           lr: float = 1e-3, enable_thinking: bool = False, eval_n: int = 64, samples: int = 4,
           max_new_tokens: int = 48, max_len: int = 512, seed: int = 0, synthetic: int = 0, log=print) -> dict:
    """Train, evaluate before/after, save to out_dir; returns the metrics (also in out_dir/grpo_lab_warmup.json)."""
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_lab.tasks.tiny import build_dir

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no GPU (use --device cpu for a small check)")
    if device == "cpu":
        torch.set_flush_denormal(True)  # tiny Adam moments turn denormal and make CPU steps ~10x slower
    random.seed(seed)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = json.loads(Path(model_dir, "config.json").read_text())
    saved_dtype = getattr(torch, config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # fp32 master weights
    model.to(device)
    enc = Encoder(tokenizer, enable_thinking)

    test_rows = load_rows(data_dir, "test")
    if synthetic:
        train_rows = synthetic_rows(synthetic, seed, exclude=load_rows(data_dir, "train") + test_rows)
        source = f"{synthetic} fresh synthetic problems (none of {data_dir}'s)"
    else:
        train_rows = load_rows(data_dir, "train")
        source = f"{data_dir}/train.parquet"
    train = enc.examples(train_rows)
    kept = [e for e in train if len(e[0]) <= max_len]
    if not kept:
        raise SystemExit(f"error: every training example is longer than --max-len {max_len}")
    test = test_rows[:eval_n]
    log(f"warm-up of {model_dir} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters) on "
        f"{source}: {len(kept)} examples ({len(train) - len(kept)} longer than {max_len} dropped), device {device}")

    before = evaluate(model, enc, test, device, max_new_tokens, samples, seed=seed)
    log(f"before: {_fmt(before)}")

    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else contextlib.nullcontext()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    losses: list[float] = []
    order: list[int] = []
    every = max(1, steps // 10)
    t_train = time.perf_counter()
    model.train()
    for step in range(steps):
        if len(order) < batch_size:
            more = list(range(len(kept)))
            random.shuffle(more)
            order += more * max(1, math.ceil(batch_size / len(kept)))
        picked, order = order[:batch_size], order[batch_size:]
        ids, labels, mask = _batch([kept[i] for i in picked], enc.pad_id, device)
        with autocast:
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % every == 0 or step == steps - 1:
            log(f"step {step + 1}/{steps}  loss {losses[-1]:.4f}  lr {sched.get_last_lr()[0]:.2e}  "
                f"{time.perf_counter() - t_train:.1f}s")
    train_s = time.perf_counter() - t_train

    model.to(saved_dtype)  # evaluate what is saved (and what vLLM runs: bf16)
    after = evaluate(model, enc, test, device, max_new_tokens, samples, seed=seed)
    log(f"after:  {_fmt(after)}")

    metrics = {"model": str(model_dir), "data": str(data_dir), "synthetic": synthetic, "steps": steps,
               "batch_size": batch_size, "lr": lr, "enable_thinking": enable_thinking, "device": device,
               "train_seconds": round(train_s, 2), "total_seconds": round(time.perf_counter() - t0, 2),
               "loss_first": losses[0], "loss_last": losses[-1], "losses": [round(x, 5) for x in losses[::every]],
               "before": before, "after": after}

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        # keep the source's tokenizer config (class, chat template) as is
        if (Path(model_dir) / "tokenizer_config.json").is_file():
            shutil.copyfile(Path(model_dir) / "tokenizer_config.json", tmp / "tokenizer_config.json")

    build_dir(Path(out_dir), metrics, True, fill, stamp=METRICS_FILE)  # the metrics are its stamp
    log(f"wrote {Path(out_dir)}/ ({train_s:.1f}s training, {steps} steps)")
    metrics["losses_all"] = losses
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.tasks.warmup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True,
                        help="model folder (e.g. data/tiny-qwen3-learn from grpo_lab.tasks.tiny)")
    parser.add_argument("--data", required=True, help="folder with train.parquet and test.parquet (verl rows)")
    parser.add_argument("--out", required=True, help="where to save the warmed-up model and tokenizer")
    parser.add_argument("--steps", type=int, default=400,
                        help="default 400: on one H200, tiny-qwen3-learn reaches about 2/3 greedy accuracy in ~10 s")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--enable-thinking", action="store_true",
                        help="format prompts with thinking on (default off, as conf/model/tiny_qwen3.yaml)")
    parser.add_argument("--eval-n", type=int, default=64, help="test prompts to score before and after")
    parser.add_argument("--samples", type=int, default=4, help="temperature-1 draws per test prompt (0: none)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-len", type=int, default=512, help="drop training examples longer than this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--synthetic", type=int, default=SYNTHETIC_ROWS, metavar="N",
                        help="train on N fresh arithmetic problems from grpo_lab.tasks.tiny's generator, none of them "
                             "in --data (whose test split is still the one scored): the model has to generalise, and "
                             "GRPO's train prompts stay new to it (default 20000; 0: train on --data's train split, "
                             "e.g. for GSM8K; on arith_tiny's 512 rows the model memorises them instead)")
    args = parser.parse_args(argv)
    if not Path(args.model, "config.json").is_file():
        print(f"error: {args.model} is not a model folder (no config.json); make one with "
              "`python -m grpo_lab.tasks.tiny --out data --variant learn`", file=sys.stderr)
        return 2
    if args.steps < 1:
        print("error: --steps must be at least 1", file=sys.stderr)
        return 2
    from grpo_lab.tasks.tiny import default_device, quiet_hf

    quiet_hf()
    warmup(args.model, args.data, args.out, args.steps, args.device or default_device(), args.batch_size, args.lr,
           args.enable_thinking, args.eval_n, args.samples, args.max_new_tokens, args.max_len, args.seed,
           args.synthetic)
    return 0


if __name__ == "__main__":
    sys.exit(main())
