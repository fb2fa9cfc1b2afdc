"""The files a job reads: train/validation parquet and the model. Missing ones are named with the command that makes
them.

    for m in missing_inputs(run.cfg, lab.dataset.name, lab.model):      # [] when every file is there
        print(m.message, m.command)            # "... does not exist", "make countdown"

The command is one that writes exactly that path: a make target for the paths it writes under the repository
(MAKERS: `make data` for data/gsm8k only), the generator's own command with `--out` for the same files elsewhere,
`huggingface-cli download` for a hub model; none when nothing of grpo-lab writes it (a file of the user's own).
"""

from __future__ import annotations

import functools
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from grpo_lab import facts
from grpo_lab.facts import hf_cached_config, hf_model_cache_dir, local_files
from grpo_lab.labconf import ModelFacts
from grpo_lab.memory.verl_view import VerlView

ROOT = facts.ROOT
T = TypeVar("T")


@dataclass(frozen=True)
class Maker:
    """A make target (Makefile) and what it writes, relative to the repository root."""

    make: str  # the command as typed in the repository root
    out: str  # the folder it writes
    files: tuple[str, ...]  # what it writes in `out` ("" = the folder itself: a model)
    module: str  # the same generator for another folder: {out} (or {parent}: --out is the parent folder)
    group: str  # the dataset or model option (conf/dataset, conf/model) whose default path it is


MAKERS: tuple[Maker, ...] = (
    Maker("make data", "data/gsm8k", ("train.parquet", "test.parquet"),
          "python -m grpo_lab.tasks.data gsm8k --out {out}", "gsm8k"),
    Maker("make arith-oneshot", "data/arith_oneshot", ("train.parquet", "test.parquet"),
          "python -m grpo_lab.tasks.arith --out {out}", "arith_oneshot"),
    Maker("make countdown", "data/countdown", ("train.parquet", "test.parquet"),
          "python -m grpo_lab.tasks.countdown --out {out}", "countdown"),
    Maker("make tiny", "data/arith_tiny", ("train.parquet", "test.parquet"),
          "python -m grpo_lab.tasks.tiny --out {parent}", "arith_tiny"),
    Maker("make own-data IN=<your .jsonl or .csv>", "data/own_qa", ("train.parquet", "test.parquet"),
          "python -m grpo_lab.tasks.data own --input <your .jsonl or .csv> --out {out}", "own_qa"),
    Maker("make smollm2", "data/smollm2-135m-instruct", ("",), "python -m grpo_lab.tasks.smollm2 --out {out}",
          "smollm2_135m"),
    Maker("make tiny", "data/tiny-qwen3", ("",), "python -m grpo_lab.tasks.tiny --out {parent}", "tiny_qwen3"),
)


@dataclass(frozen=True)
class Missing:
    path: str
    message: str  # what is wrong
    command: str = ""  # the command that makes it ("" when nothing of grpo-lab does)

    def short(self) -> str:
        """The path (relative when it is under the current folder) and its command, for a verdict line."""
        where = os.path.abspath(os.path.expanduser(self.path))
        rel = os.path.relpath(where)
        where = rel if not rel.startswith("..") else self.path
        return f"{where} ({self.command})" if self.command else where


def maker_for(path: str, group: str | None, force: bool = False) -> str:
    """The command that writes `path` ("" when none does): the make target whose output it is; else, when `group`
    (the dataset or model option in use) has a generator that writes a file of that name, that generator with its
    output folder set to the path's folder. Commands of the second kind run from the repository root.
    force: the file is there and wrong: the generator of that path with --force (make keeps the files that are
    there)."""
    p = Path(os.path.abspath(os.path.expanduser(path)))
    here = Path(os.path.abspath(os.getcwd()))
    for m in MAKERS:
        for f in m.files:
            if force and f and p in (ROOT / m.out / f, here / m.out / f):  # its path, in the checkout or here
                out = Path(m.out) if p == ROOT / m.out / f else p.parent
                cmd = m.module.format(out=_sh(out), parent=_sh(out.parent)) + " --force"
                return cmd if here == ROOT else f"cd {_sh(ROOT)} && {cmd}"
            if not force and (p == ROOT / m.out / f if f else p == ROOT / m.out):
                return m.make if here == ROOT else f"make -C {_sh(ROOT)} {m.make.removeprefix('make ')}"
    for m in MAKERS:
        if m.group != group or force:
            continue
        folder = p if m.files == ("",) else p.parent
        if m.files != ("",) and p.name not in m.files:
            continue
        if "{parent}" in m.module and folder.name != Path(m.out).name:
            continue  # grpo_lab.tasks.tiny names its folders itself
        cmd = m.module.format(out=_sh(folder), parent=_sh(folder.parent))
        return cmd if here == ROOT else f"cd {_sh(ROOT)} && {cmd}"
    return ""


def _sh(path: str | os.PathLike) -> str:
    """A path as one shell word."""
    return shlex.quote(str(path))


def per_file_version(read: Callable[[str], T]) -> Callable[[str], T | None]:
    """read(path), once per version of the file (its path, mtime and size: the fix re-checks run the rules again and
    again on the same files); None when there is no such file."""
    cached = functools.lru_cache(maxsize=32)(lambda path, _mtime_ns, _size: read(path))

    @functools.wraps(read)
    def once(path: str) -> T | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cached(path, st.st_mtime_ns, st.st_size)

    return once


@per_file_version
def parquet_columns(path: str) -> frozenset[str] | None:
    """A parquet file's columns from its schema (no rows read), a struct's fields also as `column.field`, a map's as
    `column.*`; None when it is not a parquet file pyarrow can read (rule data_files names that)."""
    import pyarrow as pa  # only when a local parquet is there to read
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except Exception:
        return None
    out = set(schema.names)
    for f in schema:
        if pa.types.is_struct(f.type):
            out.update(f"{f.name}.{f.type.field(i).name}" for i in range(f.type.num_fields))
        elif pa.types.is_map(f.type):
            out.add(f"{f.name}.*")
    return frozenset(out)


def has_column(columns: frozenset[str], name: str) -> bool:
    """`name` (a column, or `column.field`) is in the file; a map column may hold any field."""
    return name in columns or ("." in name and f"{name.split('.')[0]}.*" in columns)


def data_command(path: str, group: str | None, columns: frozenset[str]) -> tuple[str, str]:
    """The command that writes a correct data file in place of `path` (its generator again when it is one's output,
    else `make own-data` from the pairs: this file when it has question and answer columns) and the overrides that
    then read what it wrote ("" when it writes `path` itself)."""
    cmd = maker_for(path, group, force=True)
    if cmd:
        return cmd, ""
    here = Path(os.path.abspath(os.getcwd()))
    out = Path("data/own_qa") if here == ROOT else here / "data/own_qa"
    make = "make own-data" if here == ROOT else f"make -C {_sh(ROOT)} own-data OWN_OUT={_sh(out)}"
    then = f"train_file={_sh(out / 'train.parquet')} test_file={_sh(out / 'test.parquet')}"
    if {"question", "answer"} <= columns:
        return f"{make} IN={_sh(os.path.abspath(os.path.expanduser(path)))}", then
    return f"{make} IN=<your question/answer pairs: .jsonl, .csv or .parquet>", then


def _gguf(key: str, model: str, file: Path) -> Missing:
    """A GGUF file (llama.cpp's format) as model_path: verl loads a Hugging Face folder; transformers converts it."""
    out = file.with_suffix("")
    cmd = (f"python -c \"import sys, transformers as t; d, f, o = sys.argv[1:]; [c.from_pretrained(d, gguf_file=f)"
           f".save_pretrained(o) for c in (t.AutoTokenizer, t.AutoModelForCausalLM)]\" "
           f"{_sh(file.parent)} {_sh(file.name)} {_sh(out)}")
    return Missing(model, f"{key}: {model} is a GGUF file (llama.cpp's format); verl loads a Hugging Face model "
                          f"folder. Convert it with transformers' gguf_file= (pip install gguf; what make smollm2 "
                          f"does for SmolLM2's GGUF, grpo_lab/tasks/smollm2.py): `{cmd}`, then "
                          f"model_path={_sh(out)}", cmd)


def missing_inputs(cfg: VerlView, dataset: str | None, model_facts: ModelFacts,
                   environ: Mapping[str, str] | None = None) -> list[Missing]:
    """The job's input files (the data files and model of verl's config) that are not here, each with the command
    that makes it (`dataset`, `model_facts`: the options chosen, lab.dataset.name and lab.model); [] when all are
    there."""
    environ = os.environ if environ is None else environ
    out: list[Missing] = []
    for key, value in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        items = value if isinstance(value, (list, tuple)) else [value]
        for path in (p for item in items for p in (local_files(item) or [])):  # remote files are not checked
            if os.path.isfile(path):
                continue
            flag = "train_file" if "train" in key else "test_file"
            cmd = maker_for(path, dataset)
            how = (f"`{cmd}` writes it" if cmd else "nothing in grpo-lab writes this path: check it") + \
                f", or point to your own file: python run.py {flag}=/path/to/file.parquet"
            out.append(Missing(path, f"{key}: {path} does not exist; {how}", cmd))
    key, model = "actor_rollout_ref.model.path", str(cfg.model.path or "")
    if not model:
        return out
    if model.startswith(("/", "./", "../", "~")) or os.path.isdir(os.path.expanduser(model)):
        folder = Path(os.path.expanduser(model))
        weights = [*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")]
        if (folder / "config.json").is_file() and weights:
            return out
        if folder.is_file() and folder.suffix.lower() == ".gguf":
            return [*out, _gguf(key, model, folder)]
        what = ("does not exist" if not folder.exists() else
                "is empty" if folder.is_dir() and not any(folder.iterdir()) else
                "holds a config.json but no weights (*.safetensors or pytorch_model*.bin)"
                if (folder / "config.json").is_file() else "holds no model (no config.json)")
        name, hub = model_facts.name, model_facts.hub_id
        cmd = maker_for(model, name)
        if cmd:
            how = f"`{cmd}` makes it"
        elif hub:
            cmd = f"huggingface-cli download {hub} --local-dir {model}"
            how = f"`{cmd}` puts the model option's {name} there"
        else:
            how = "put a Hugging Face model folder there (config.json, weights, tokenizer)"
        out.append(Missing(model, f"{key}: {model} {what}; {how}, or choose another: python run.py "
                                  f"model_path=/path/to/model", cmd))
        return out
    # the variable that keeps the Hugging Face hub off, as huggingface_hub reads HF_HUB_OFFLINE ("" when it is on)
    gate = next((name for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
                 if str(environ.get(name, "")).strip().upper() in ("1", "ON", "YES", "TRUE")), "")
    if gate and hf_cached_config(model, environ) is None:
        cached = hf_model_cache_dir(model, environ)
        cmd = f"huggingface-cli download {model}"
        out.append(Missing(model, f"{key}: {model} is a hub id, the hub is off ({gate}={environ.get(gate)}) and "
                                  f"it is not in the cache (no snapshot with config.json under {cached}). "
                                  f"Download it where there is a network (`{cmd}`), or use a local folder: "
                                  f"python run.py model_path=/path", cmd))
    return out

