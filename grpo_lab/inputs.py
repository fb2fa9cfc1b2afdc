"""The files a job reads: train/validation parquet and the model. Missing ones are named with the command that makes them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from grpo_lab.config import get
from grpo_lab.facts import hf_model_cache_dir


def local_files(value: Any) -> list[str] | None:
    """Local paths of data.train_files / val_files (a string or a list); None when any is remote (hdfs://, s3://)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for item in items:
        if item is None:
            continue
        s = str(item)
        if "://" in s and not s.startswith("file://"):
            return None
        out.append(os.path.expanduser(s.removeprefix("file://")))
    return out


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~")) or os.path.isdir(os.path.expanduser(path))


def check_inputs(verl: dict[str, Any], lab: dict[str, Any], environ: Mapping[str, str] | None = None) -> list[str]:
    """Problems with the job's input files, each with the fix; empty when all are there."""
    environ = os.environ if environ is None else environ
    problems = []
    make = get(lab, "dataset.make", "make data")
    for key in ("data.train_files", "data.val_files"):
        value = get(verl, key)
        items = value if isinstance(value, (list, tuple)) else [value]
        for path in (p for item in items for p in (local_files(item) or [])):  # remote files are not checked
            if not os.path.isfile(path):
                problems.append(f"{key}: {path} does not exist. Make it with `{make}`, or point to your own file: "
                                f"python run.py {'train_file' if 'train' in key else 'test_file'}=/path/to/file.parquet")
    model = str(get(verl, "actor_rollout_ref.model.path") or "")
    if _looks_local(model):
        folder = os.path.expanduser(model)
        if not os.path.isfile(os.path.join(folder, "config.json")):
            hint = "make tiny" if get(lab, "model.name") == "tiny_qwen3" else \
                f"huggingface-cli download {get(lab, 'model.hub_id') or '<hub id>'} --local-dir {model}"
            problems.append(f"actor_rollout_ref.model.path: {model} holds no model (no config.json). Make or fetch "
                            f"it with `{hint}`, or choose another: python run.py model_path=/path/to/model")
    elif environ.get("HF_HUB_OFFLINE") == "1" or environ.get("TRANSFORMERS_OFFLINE") == "1":
        cached = str(hf_model_cache_dir(model, environ))
        if not os.path.isdir(cached):
            problems.append(f"actor_rollout_ref.model.path: {model} is a hub id, the hub is off (HF_HUB_OFFLINE=1) "
                            f"and it is not in the cache ({cached}). Download it where there is a network "
                            f"(huggingface-cli download {model}) or use a local folder: python run.py model_path=/path")
    return problems
