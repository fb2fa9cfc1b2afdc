"""Qwen3 of the real shapes with random weights, offline: for measuring memory and speed, not for learning.

    python -m grpo_lab.tasks.qwen3_random --size 0_6b                  # make qwen3-random SIZE=0_6b
    python -m grpo_lab.tasks.qwen3_random --size all                   # make qwen3-random: 0.6B, 1.7B, 4B and 8B
    python -m grpo_lab.tasks.qwen3_random --size 8b --out /big/disk/qwen3-8b-random-weights --force
    python -m grpo_lab.tasks.qwen3_random --size 0_6b --layers 2 --hidden 64 --intermediate 128 --heads 2 --kv-heads 1
                                                                 # a reduced model (tests): the real vocabulary

What the folder holds (config, weights, tokenizer) and how to plan or run it: docs/tasks.md.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from grpo_lab import facts
from grpo_lab.tasks import tiny

FORMAT_VERSION = 1  # bump when what this module writes changes, so old folders are rebuilt
STAMP = "grpo_lab_qwen3_random.json"
# config.json's key (read by grpo_lab.facts.random_weights) and the words every plan and report print
MARK_KEY = facts.RANDOM_WEIGHTS_KEY
MARK = "random weights: memory and speed only"

# --size -> (conf/model group with the architecture, to use with the folder; folder name under data/)
SIZES: dict[str, tuple[str, str]] = {
    "0_6b": ("qwen3_0_6b", "qwen3-0.6b-random-weights"),
    "1_7b": ("qwen3_1_7b", "qwen3-1.7b-random-weights"),
    "4b": ("qwen3_4b", "qwen3-4b-random-weights"),
    "8b": ("qwen3_8b_lora", "qwen3-8b-random-weights"),
}
VOCAB_SIZE = 151936
REGULAR_TOKENS = 151643  # Qwen3's: <|endoftext|> is the first added token, at 151643
SHARD_SIZE = "5GB"  # safetensors shards, as Qwen publishes them
LETTERS = "etaoinshrdlcumwfgypbvkjxqz"  # by English frequency: the first merges are the likeliest
# a reduced model's options -> the architecture's keys
REDUCED = {"--layers": "num_hidden_layers", "--hidden": "hidden_size", "--intermediate": "intermediate_size",
           "--heads": "num_attention_heads", "--kv-heads": "num_key_value_heads"}


def arch_for(size: str, **reduced: int | None) -> tiny.Qwen3Arch:
    """The architecture of model=<group> for this size (as Hydra composes it); reduced: num_hidden_layers=..., ..."""
    m = facts.conf_option("model", SIZES[size][0])["lab"]["model"]
    arch = tiny.Qwen3Arch(**{k: m[k] for k in tiny.Qwen3Arch.__dataclass_fields__})
    return replace(arch, **{k: v for k, v in reduced.items() if v is not None})


# ------------------------------------------------------------------------------------------------------ tokenizer

def full_vocab_bpe(n_regular: int = REGULAR_TOKENS):
    """A tokenizers.Tokenizer with Qwen's pipeline and exactly n_regular regular tokens, each reachable by a merge:
    byte tokens, tiny's trained merges, whitespace runs, then words extended breadth-first (docs/tasks.md)."""
    from tokenizers import models
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's byte -> printable character map

    b2u = bytes_to_unicode()
    trained = tiny.bpe_trained(tiny.tokenizer_corpus(tiny.arith_splits(512, 64, 0)["train"]), 2048)
    vocab = {b2u[b]: b for b in range(256)}
    merges: list[tuple[str, str]] = []

    def add(a: str, b: str) -> None:
        if a + b not in vocab and a in vocab and b in vocab and len(vocab) < n_regular:
            vocab[a + b] = len(vocab)
            merges.append((a, b))

    # the trained merges in their order (tokenizer.json holds them; the model object does not list them)
    for pair in json.loads(trained.to_str())["model"]["merges"]:
        a, b = pair if isinstance(pair, list) else pair.split(" ", 1)
        add(a, b)
    space, newline = b2u[ord(" ")], b2u[ord("\n")]
    for ch, longest in ((space, 16), (newline, 4)):  # runs of up to 16 spaces, 4 newlines
        for n in range(1, longest):
            add(ch * n, ch)
    letters = list(LETTERS) + list(LETTERS.upper())
    level = [space] + letters
    while len(vocab) < n_regular:
        nxt = []
        for token, c in itertools.product(level, letters):
            add(token, c)
            if token + c in vocab:  # new, or made earlier (trained): extended on the next level either way
                nxt.append(token + c)
            if len(vocab) >= n_regular:
                break
        level = nxt
    return tiny.qwen_pipeline(models.BPE(vocab=vocab, merges=merges, unk_token=None, continuing_subword_prefix="",
                                         end_of_word_suffix="", fuse_unk=False, byte_fallback=False))


@functools.cache
def full_vocab_tokenizer():
    """Qwen3's layout of 151,936 ids (built once per process, ~5 s)."""
    first = REGULAR_TOKENS + len(tiny.ADDED_TOKENS)
    tok = tiny.finish_tokenizer(full_vocab_bpe(), VOCAB_SIZE, [f"<|reserved_{i}|>" for i in range(first, VOCAB_SIZE)])
    if len(tok) != VOCAB_SIZE:
        raise AssertionError(f"tokenizer has {len(tok)} tokens, not {VOCAB_SIZE}")
    return tok


# ------------------------------------------------------------------------------------------------------ the folder

def build(size: str, out: str | os.PathLike | None = None, *, seed: int = 0, device: str | None = None,
          force: bool = False, **reduced: int | None) -> Path:
    """Build (or keep, when up to date) the random-weight Qwen3 of this size; returns its folder."""
    group, folder = SIZES[size]
    arch = arch_for(size, **reduced)
    is_reduced = any(v is not None for v in reduced.values())
    final = Path(out) if out else Path("data") / (folder.replace("-random", "-reduced-random") if is_reduced
                                                   else folder)
    settings = {"version": FORMAT_VERSION, "size": size, "conf_model": group, "arch": asdict(arch), "seed": seed,
                "dtype": "bfloat16", "reduced": is_reduced}
    device = device or tiny.default_device()
    info: dict = {}

    def fill(tmp: Path) -> None:
        t0 = time.perf_counter()
        tok = full_vocab_tokenizer()
        tiny.save_tokenizer(tok, tmp)
        info["tokenizer_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        mark = (f"{MARK}: seeded random init (seed {seed}) of Qwen3's {size.replace('_', '.')} architecture"
                + (" (reduced)" if is_reduced else "") + " by grpo_lab.tasks.qwen3_random; rewards and validation "
                "scores mean nothing")
        info["params"] = tiny.build_model(arch, tok, seed, tmp, device=device, max_shard_size=SHARD_SIZE,
                                          config_extra={MARK_KEY: mark})
        info["model_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if tiny.build_dir(final, settings, force, fill, stamp=STAMP, log=print):
        size_gb = sum(p.stat().st_size for p in final.glob("*.safetensors")) / 1e9
        print(f"wrote {final}/: Qwen3ForCausalLM {info['params'] / 1e9:.3f}B parameters ({arch.num_hidden_layers} "
              f"layers, hidden {arch.hidden_size}, vocab {arch.vocab_size}), {size_gb:.2f} GB bf16 safetensors, "
              f"{MARK}; built on {device} in {time.perf_counter() - t0:.1f}s (tokenizer {info['tokenizer_s']:.1f}s, "
              f"model init + save {info['model_s']:.1f}s)")
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.tasks.qwen3_random", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="all", choices=sorted(SIZES) + ["all"],
                        help="0_6b, 1_7b, 4b, 8b (architectures of conf/model/), or all (default)")
    parser.add_argument("--out", help="output folder (one size only; default data/qwen3-<size>-random-weights)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", help="where the weights are created: cuda when there is a GPU, else cpu")
    parser.add_argument("--force", action="store_true", help="rebuild even when the folder is up to date")
    reduced = parser.add_argument_group("a reduced model (tests on CPU; the real vocabulary and head_dim)")
    for flag, key in REDUCED.items():
        reduced.add_argument(flag, dest=key, type=int)
    args = parser.parse_args(argv)
    sizes = list(SIZES) if args.size == "all" else [args.size]
    if args.out and len(sizes) > 1:
        parser.error("--out names one folder: give one --size with it")
    tiny.quiet_hf(offline=True)
    red = {k: getattr(args, k) for k in REDUCED.values()}
    t0 = time.perf_counter()
    for size in sizes:
        path = build(size, args.out, seed=args.seed, device=args.device, force=args.force, **red)
        print(f"  use it: python run.py model={SIZES[size][0]} model_path={path.resolve()} ...")
    if len(sizes) > 1:
        print(f"all {len(sizes)} in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
