"""Offline tiny Qwen3 + synthetic arithmetic: check an install (and verl's GRPO path) before downloading anything.

    python -m grpo_lab.tasks.tiny --out data                    # make tiny: data/arith_tiny/ and data/tiny-qwen3/
    python -m grpo_lab.tasks.tiny --out data --variant all      # and data/tiny-qwen3-learn/ (for grpo_lab.tasks.warmup)
    python -m grpo_lab.tasks.tiny --out data --force            # redo

What it writes, and the tokenizer's size: docs/tasks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from grpo_lab.facts import umask
from grpo_lab.tasks.data import DATA_SOURCE, INSTRUCTION, QUESTION, distinct, gsm8k_record, gsm8k_row, write_splits
from grpo_lab.tasks.splits import stamp_holds

FORMAT_VERSION = 2  # bump when what this module writes changes, so old outputs are rebuilt
STAMP = "grpo_lab_tiny.json"

# ------------------------------------------------------------------------------------------------------ the model

@dataclass(frozen=True)
class Qwen3Arch:
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int = 4096
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 4096


# "tiny" must match conf/model/tiny_qwen3.yaml (lab.model.*); a test checks it.
INIT_STD = 0.02  # the weights' normal(0, std): transformers' Qwen3Config default initializer_range

VARIANTS: dict[str, tuple[str, Qwen3Arch]] = {
    "tiny": ("tiny-qwen3", Qwen3Arch(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                     head_dim=16, intermediate_size=128)),
    "learn": ("tiny-qwen3-learn", Qwen3Arch(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                            num_key_value_heads=2, head_dim=64, intermediate_size=768)),
}

# ------------------------------------------------------------------------------------------------------ tokenizer

# Qwen2/Qwen3's pre-tokenizer regex (each digit is its own token)
PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                     r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
# Qwen3's added tokens in Qwen3's order (ids 151643.. there); special=True ones are dropped by skip_special_tokens
ADDED_TOKENS: list[tuple[str, bool]] = [(content, True) for content in (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>")] + [(content, False) for content in (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
    "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>")]
EOS, PAD = "<|im_end|>", "<|endoftext|>"

# Qwen3's chat template (tools, reasoning_content of the last turn, enable_thinking): with enable_thinking=False
# the generation prompt ends in an empty "<think>\n\n</think>\n\n" block, as Qwen3's does.
CHAT_TEMPLATE = (Path(__file__).parent / "qwen3_chat_template.jinja").read_text().rstrip("\n")

# ------------------------------------------------------------------------------------------------------ the data

NAMES = ["Tom", "Anna", "Ben", "Mia", "Sam", "Lena", "Omar", "Priya", "Jack", "Emma", "Luis", "Nora"]
THINGS = ["apples", "books", "marbles", "stickers", "coins", "pencils", "cookies", "cards", "shells", "stamps"]
BARE_SHARE = 0.6  # of the problems, bare expressions ("What is 23 + 48?"); the rest word problems


def arith_problem(rng: random.Random) -> tuple[str, str, int]:
    """(question, the expression the answer shows, value) for one random problem."""
    op = rng.choices(["+", "-", "*"], weights=[4, 3, 2])[0]
    if op == "*":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
    elif op == "-":
        a = rng.randint(1, 99)
        b = rng.randint(0, a)
    else:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    expr = f"{a} {op} {b}"
    if rng.random() < BARE_SHARE:
        return f"What is {expr}?", expr, value
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    question = {
        "+": f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?",
        "-": f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?",
        "*": f"{name} buys {a} bags with {b} {thing} in each bag. How many {thing} does {name} buy?",
    }[op]
    return question, expr, value


def arith_records(n: int, seed: int, exclude: set[str] = frozenset()) -> list[dict]:
    """n distinct GSM8K-format records {question, answer}; answers read "23 + 48 = 71\\n#### 71"."""
    return distinct(lambda rng: gsm8k_record(*arith_problem(rng)), n, random.Random(seed), QUESTION, exclude,
                    f"found fewer than {n} distinct arithmetic problems; ask for fewer")


def arith_splits(n_train: int, n_test: int, seed: int) -> dict[str, list[dict]]:
    """{"train": records, "test": records}, disjoint questions."""
    test = arith_records(n_test, seed + 1)
    return {"train": arith_records(n_train, seed, exclude={r["question"] for r in test}), "test": test}


def tokenizer_corpus(records: list[dict]) -> list[str]:
    texts = [f"{r['question']} {INSTRUCTION}" for r in records] + [r["answer"] for r in records]
    # the chat template's words, often enough to become tokens of their own
    return texts + ["system\nYou are a helpful assistant.\n", "user\n", "assistant\n", "\n\n", "\n"] * 8

# ------------------------------------------------------------------------------------------------------ builders


def qwen_pipeline(bpe):
    """A tokenizers.Tokenizer around a byte-level BPE model with the pipeline of Qwen2/Qwen3's tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers

    tok = Tokenizer(bpe)
    # the same pipeline as transformers' Qwen2Tokenizer builds, so loading by either class gives the same ids
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def finish_tokenizer(tok, vocab_size: int, reserved: list[str] = ()):
    """Qwen3's added tokens (then `reserved` special tokens) after tok's vocabulary, wrapped as a transformers fast
    tokenizer with Qwen3's chat template; at most vocab_size tokens in all."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    added = list(ADDED_TOKENS) + [(content, True) for content in reserved]
    for content, special in added:  # one by one, so the ids follow the list's order
        add = tok.add_special_tokens if special else tok.add_tokens
        add([AddedToken(content, special=special, normalized=False)])
    if tok.get_vocab_size() > vocab_size:
        raise AssertionError(f"tokenizer has {tok.get_vocab_size()} tokens, more than vocab_size {vocab_size}")
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token=EOS, pad_token=PAD, unk_token=None,
        additional_special_tokens=[c for c, special in added if special and c not in (EOS, PAD)],
        model_max_length=131072, clean_up_tokenization_spaces=False, split_special_tokens=False,
        add_prefix_space=False, errors="replace")
    hf.chat_template = CHAT_TEMPLATE
    return hf


def bpe_trained(corpus: list[str], vocab_size: int):
    """A tokenizers.Tokenizer (Qwen's pipeline): byte-level BPE trained on corpus up to vocab_size tokens."""
    from tokenizers import models, pre_tokenizers, trainers

    tok = qwen_pipeline(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                                   fuse_unk=False, byte_fallback=False))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def build_tokenizer(corpus: list[str], vocab_size: int):
    """A transformers fast tokenizer: byte-level BPE trained on corpus, Qwen3's added tokens, ChatML template."""
    return finish_tokenizer(bpe_trained(corpus, vocab_size - len(ADDED_TOKENS)), vocab_size)


def save_tokenizer(tokenizer, path: Path) -> None:
    tokenizer.save_pretrained(path)
    # Declare Qwen2Tokenizer as Qwen3 does: transformers (and vLLM through it) then rebuilds exactly the pipeline
    # trained here from vocab + merges; the chat template is also kept in tokenizer_config.json for older readers.
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    if "extra_special_tokens" in cfg:  # the key Qwen3 ships (transformers 5 reads it as extra_special_tokens)
        cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens")
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def build_model(arch: Qwen3Arch, tokenizer, seed: int, path: Path, *, device: str = "cpu", max_shard_size: str = "5GB",
                config_extra: dict | None = None) -> int:
    """Random-weight Qwen3ForCausalLM saved (bf16 safetensors + generation_config.json) to path; returns #params.
    Seeded, initialised in bf16 on `device` (transformers' init): no fp32 copy. config_extra: more config.json keys."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    pad_id = tokenizer.convert_tokens_to_ids(PAD)
    config = Qwen3Config(
        **asdict(arch), hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1_000_000.0, attention_bias=False,
        attention_dropout=0.0, use_sliding_window=False, sliding_window=None, max_window_layers=arch.num_hidden_layers,
        initializer_range=INIT_STD, bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id, use_cache=True,
        **(config_extra or {}),
    )
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(seed)
    with torch.device(device):  # parameters are created (and initialised) in bf16
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id)
    model.save_pretrained(path, safe_serialization=True, max_shard_size=max_shard_size)
    return sum(p.numel() for p in model.parameters())


def build_dir(final: Path, settings: dict, force: bool, fill, stamp: str = STAMP, log=None) -> bool:
    """Run fill(tmp_dir) and publish it as final unless final already holds these settings (its stamp file: then
    log says it was kept); True when built."""
    if not force and stamp_holds(final, stamp, settings):
        if log:
            log(f"kept  {final}/ (same settings; --force rebuilds)")
        return False
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        fill(tmp)
        # mkdtemp/mkstemp make private files: the folder and its files get the usual umask-based modes
        mask = umask()
        os.chmod(tmp, 0o777 & ~mask)
        for path in tmp.iterdir():
            os.chmod(path, 0o666 & ~mask)
        (tmp / stamp).write_text(json.dumps(settings, indent=2) + "\n")
        # into place, replacing an old one
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return True


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def quiet_hf(offline: bool = False, **more: str) -> None:
    """Before transformers loads or saves: no tokenizer threads, no progress bars ("Loading weights" / "Writing model
    shards"), offline when asked; more: other variables (each only where the environment sets none)."""
    quiet = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    if offline:
        quiet.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for key, value in {**quiet, **more}.items():
        os.environ.setdefault(key, value)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def make_tiny(out: str | os.PathLike, variants: list[str], n_train: int = 512, n_test: int = 64, seed: int = 0,
              force: bool = False, log=print) -> dict[str, Path]:
    """Build the synthetic data and the requested model variants under out; returns {name: path}."""
    out = Path(out)
    splits = arith_splits(n_train, n_test, seed)
    data_settings = {"version": FORMAT_VERSION, "kind": "arith", "train": n_train, "test": n_test, "seed": seed}
    paths = {"arith_tiny": out / "arith_tiny"}

    def fill_data(tmp: Path) -> None:
        write_splits({split: [gsm8k_row(r["question"], r["answer"], split, i) for i, r in enumerate(recs)]
                      for split, recs in splits.items()}, tmp)

    t0 = time.perf_counter()
    built = build_dir(paths["arith_tiny"], data_settings, force, fill_data)
    log(f"{'wrote' if built else 'kept '} {paths['arith_tiny']}/: train {n_train} rows, test {n_test} rows "
        f"(data_source {DATA_SOURCE})" + (f" in {time.perf_counter() - t0:.1f}s" if built else ""))

    tokenizer = None
    for variant in variants:
        name, arch = VARIANTS[variant]
        settings = {"version": FORMAT_VERSION, "kind": "model", "arch": asdict(arch), "data": data_settings}
        paths[name] = out / name
        info: dict = {}

        def fill_model(tmp: Path, arch=arch, info=info) -> None:
            nonlocal tokenizer
            if tokenizer is None:
                tokenizer = build_tokenizer(tokenizer_corpus(splits["train"]), arch.vocab_size)
            save_tokenizer(tokenizer, tmp)
            info["params"] = build_model(arch, tokenizer, seed, tmp)

        t0 = time.perf_counter()
        if build_dir(paths[name], settings, force, fill_model, log=log):
            log(f"wrote {paths[name]}/: Qwen3ForCausalLM {info['params'] / 1e6:.2f}M parameters "
                f"({arch.num_hidden_layers} layers, hidden {arch.hidden_size}, vocab {arch.vocab_size}), "
                f"tokenizer {len(tokenizer)} tokens, in {time.perf_counter() - t0:.1f}s")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.tasks.tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data", help="parent folder (default: data)")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS) + ["all"],
                        help="model(s) to build: tiny (default; conf/model/tiny_qwen3.yaml), learn (for "
                             "grpo_lab.tasks.warmup), all; repeatable")
    parser.add_argument("--train-size", type=int, default=512)
    parser.add_argument("--test-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even when the outputs are up to date")
    args = parser.parse_args(argv)
    variants = args.variant or ["tiny"]
    variants = sorted(VARIANTS) if "all" in variants else list(dict.fromkeys(variants))
    quiet_hf()
    make_tiny(args.out, variants, args.train_size, args.test_size, args.seed, args.force)
    print("next: python run.py experiment=smoke_tiny hardware=h200x1 preflight.only=true   (then without "
          "preflight.only on a GPU: make smoke-tiny)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
