"""Facts grpo-lab reads in more than one place, written once: the Ray CPU formula, the Hugging Face cache path,
atomic file writes, and what the machine, the files and the config folder say (cheaply: no torch, verl, ray).

What each function gives: docs/cli.md."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import re
import struct
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# the verl key of the environment verl hands its Ray workers (the rules, the emulation and the launcher read and set it)
RAY_ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"

# ---------------------------------------------------------------------------------------------------------------
# Ray's CPUs, as verl 0.9.1 asks for them (docs/cli.md)

CPUS_PER_GPU = 3
TASK_RUNNER_CPUS = 1
TQ_CONTROLLER_CPUS = 1


def ray_cpus_per_job(use_v1: bool, storage_units: int) -> int:
    """The CPUs asked for once per job (wherever Ray places them): TaskRunner (+ TransferQueue when V1)."""
    return TASK_RUNNER_CPUS + ((TQ_CONTROLLER_CPUS + storage_units) if use_v1 else 0)


def ray_cpus_needed(gpus_per_node: int, use_v1: bool, storage_units: int) -> int:
    """The CPUs one node needs when it also hosts the once-per-job actors (a single node always does)."""
    return CPUS_PER_GPU * gpus_per_node + ray_cpus_per_job(use_v1, storage_units)


def ray_cpus_formula(gpus_per_node: int, use_v1: bool, storage_units: int) -> str:
    if use_v1:
        return (f"{CPUS_PER_GPU} per GPU x {gpus_per_node} + 1 TaskRunner + 1 TransferQueue controller + "
                f"{storage_units} storage units")
    return f"{CPUS_PER_GPU} per GPU x {gpus_per_node} + 1 TaskRunner"


# ---------------------------------------------------------------------------------------------------------------
# the Hugging Face cache (huggingface_hub's rule: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)

def hf_hub_cache(environ: Mapping[str, str]) -> str:
    if environ.get("HF_HUB_CACHE"):
        return environ["HF_HUB_CACHE"]
    home = environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def hf_model_cache_dir(repo_id: str, environ: Mapping[str, str]) -> Path:
    return Path(hf_hub_cache(environ)) / ("models--" + repo_id.replace("/", "--"))


# ---------------------------------------------------------------------------------------------------------------
# atomic writes

def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write a file whole or not at all (a unique temp file beside it, then rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the file gets the mode a plain open() would give
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    return path


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """`data` as indented JSON (anything else as its str), written whole or not at all (atomic_write)."""
    import json

    return atomic_write(path, json.dumps(data, indent=2, default=str) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# the model groups: conf/model/*.yaml, read as files (no Hydra): which model_path each one plans

def load_yaml(path: str | os.PathLike) -> Any:
    """A YAML file's data (libyaml's safe loader where there is one)."""
    import yaml

    return yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_yaml_or(path: str | os.PathLike, default: Any) -> Any:
    """load_yaml, or `default` when the file is unreadable, not YAML, or empty."""
    import yaml

    try:
        return load_yaml(path) or default
    except (OSError, yaml.YAMLError):
        return default


@functools.cache
def model_groups() -> dict[str, dict[str, Any]]:
    """{model_path or hub id: that group's lab.model} for the files in conf/model/ (local paths: their folder name)."""
    out: dict[str, dict[str, Any]] = {}
    for f in sorted((ROOT / "conf" / "model").glob("*.yaml")):
        doc = load_yaml_or(f, {})
        model = (doc.get("lab") or {}).get("model") or {}
        if not isinstance(model, dict) or not model.get("name"):
            continue
        for key in (doc.get("model_path"), model.get("hub_id")):
            if isinstance(key, str) and key and "${" not in key:
                out.setdefault(key, dict(model))
    return out


def model_group_of_folder(folder: str) -> dict[str, Any] | None:
    """The lab.model of the conf/model option whose model_path ends in this folder name (a recorded job's model
    folder, e.g. /tmp/w/data/smollm2-135m-instruct), else None."""
    for f in sorted((ROOT / "conf" / "model").glob("*.yaml")):
        doc = load_yaml(f) or {}
        if str(doc.get("model_path") or "").rstrip("/").rsplit("/", 1)[-1] == folder:
            return (doc.get("lab") or {}).get("model")
    return None


def hardware_card_gb(name: str, _seen: frozenset[str] = frozenset()) -> float | None:
    """conf/hardware/<name>.yaml's lab.hardware.gpu_memory_gb, or that of the option its defaults list names; None."""
    path = ROOT / "conf" / "hardware" / f"{name}.yaml"
    if name in _seen or not path.is_file():
        return None
    doc = load_yaml_or(path, {})
    gb = ((doc.get("lab") or {}).get("hardware") or {}).get("gpu_memory_gb")
    if isinstance(gb, (int, float)) and not isinstance(gb, bool) and gb > 0:
        return float(gb)
    parents = [d for d in doc.get("defaults") or () if isinstance(d, str) and d != "_self_"]
    return next((gb for d in parents if (gb := hardware_card_gb(d, _seen | {name})) is not None), None)


# the key grpo_lab.tasks.qwen3_random writes into config.json: its value starts "random weights: memory and speed only"
RANDOM_WEIGHTS_KEY = "grpo_lab_random_weights"


def random_weights_mark(config: Mapping[str, Any] | str | os.PathLike | None) -> str:
    """The mark of a model with random weights ("random weights: memory and speed only: ..."), or "": from a
    config.json mapping, or from a model folder / its config.json path."""
    if config is not None and not isinstance(config, Mapping):
        path = Path(os.path.expanduser(str(config)))
        path = path / "config.json" if path.is_dir() else path
        try:
            import json

            config = json.loads(path.read_text()) if path.name == "config.json" else {}
        except (OSError, ValueError):
            config = {}
    mark = (config or {}).get(RANDOM_WEIGHTS_KEY) if isinstance(config, Mapping) else None
    return mark if isinstance(mark, str) and mark else ""


@functools.cache
def preset_learning_rates() -> tuple[tuple[float, str], ...]:
    """The actor learning rates the files under conf/ set (actor_lr, or verl's actor_rollout_ref.actor.optim.lr):
    ((value, file relative to the repository), ...), lowest first."""
    out = []
    for f in sorted((ROOT / "conf").rglob("*.yaml")):
        doc = load_yaml_or(f, {})
        if not isinstance(doc, dict):
            continue
        optim = ((doc.get("actor_rollout_ref") or {}).get("actor") or {}).get("optim") or {}
        for v in (doc.get("actor_lr"), optim.get("lr") if isinstance(optim, dict) else None):
            try:
                lr = float(v) if v is not None and not isinstance(v, bool) else None
            except (TypeError, ValueError):  # an interpolation (${actor_lr})
                lr = None
            if lr is not None:
                out.append((lr, str(f.relative_to(ROOT))))
    return tuple(sorted(out))


# ---------------------------------------------------------------------------------------------------------------
# files and the machine, cheaply

def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _skip(buf: bytes, pos: int, ttype: int) -> int:
    """Skip one thrift-compact value of type `ttype`."""
    if ttype in (1, 2):          # bool inside a struct: value is in the type nibble
        return pos
    if ttype == 3:               # byte
        return pos + 1
    if ttype in (4, 5, 6):       # i16, i32, i64: varints
        return _varint(buf, pos)[1]
    if ttype == 7:               # double
        return pos + 8
    if ttype == 8:               # binary/string
        n, pos = _varint(buf, pos)
        return pos + n
    if ttype in (9, 10):         # list, set
        head = buf[pos]
        pos += 1
        size, etype = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        for _ in range(size):
            pos = pos + 1 if etype in (1, 2) else _skip(buf, pos, etype)
        return pos
    if ttype == 11:              # map
        size, pos = _varint(buf, pos)
        if size:
            kv = buf[pos]
            pos += 1
            for _ in range(size):
                pos = _skip(buf, pos, kv >> 4)
                pos = _skip(buf, pos, kv & 0x0F)
        return pos
    if ttype == 12:              # struct
        fid = 0
        while True:
            fid, ft, pos = _field_header(buf, pos, fid)
            if ft == 0:
                return pos
            pos = _skip(buf, pos, ft)
    raise ValueError(f"unknown thrift type {ttype}")


def _field_header(buf: bytes, pos: int, fid: int) -> tuple[int, int, int]:
    """The next field header of a thrift-compact struct: (field id, type, position after it); type 0 ends it."""
    head = buf[pos]
    pos += 1
    if head == 0:
        return fid, 0, pos
    delta, ft = head >> 4, head & 0x0F
    if delta:
        fid += delta
    else:
        raw, pos = _varint(buf, pos)
        fid = _zigzag(raw)
    return fid, ft, pos


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


def parquet_num_rows(path: str | os.PathLike) -> int:
    """Row count from a parquet file's footer (FileMetaData.num_rows), without pyarrow: reads only the footer (else,
    when it is not the plain thrift-compact kind, e.g. encrypted, from pyarrow's metadata)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(size - 8)
        tail = f.read(8)
        if tail[4:] != b"PAR1":
            raise ValueError(f"{path} is not a plain parquet file")
        (footer_len,) = struct.unpack("<I", tail[:4])
        f.seek(size - 8 - footer_len)
        buf = f.read(footer_len)
    try:
        pos, fid = 0, 0
        while True:
            fid, ft, pos = _field_header(buf, pos, fid)
            if ft == 0:
                break
            if fid == 3 and ft == 6:  # FileMetaData.num_rows: i64
                raw, pos = _varint(buf, pos)
                return _zigzag(raw)
            pos = _skip(buf, pos, ft)
    except (IndexError, ValueError):
        pass
    import pyarrow.parquet as pq  # slow import (~0.3 s): only when the footer is unusual

    return int(pq.ParquetFile(path).metadata.num_rows)


def _proc_gpus() -> int | None:
    path = "/proc/driver/nvidia/gpus"
    try:
        return len([e for e in os.listdir(path) if not e.startswith(".")])
    except OSError:
        return None


def _smi_gpus() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def visible_gpus(environ: Mapping[str, str]) -> tuple[int, str]:
    """How many CUDA GPUs this process would see, without importing torch: (count, how it was found)."""
    physical, source = _proc_gpus(), "/proc/driver/nvidia/gpus"
    if physical is None:
        physical, source = _smi_gpus(), "nvidia-smi -L"
    if physical is None:
        physical, source = 0, "no NVIDIA driver found (/proc/driver/nvidia, nvidia-smi)"
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return physical, source
    # CUDA stops at the first invalid entry
    entries = list(itertools.takewhile(lambda e: e and not e.startswith("-"), (e.strip() for e in cvd.split(","))))
    return min(len(entries), physical), f"CUDA_VISIBLE_DEVICES={cvd!r} of {physical} ({source})"


def machine_cpus() -> int:
    """CPUs Ray would find when num_cpus is null: the affinity mask, capped by a cgroup v2 quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return n


def installed_version(dist: str) -> tuple[int, ...] | None:
    """The installed distribution's version as numbers (read from its metadata, nothing imported); None: absent."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version(dist)
    except PackageNotFoundError:
        return None
    nums = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        nums.append(int(digits))
    return tuple(nums)


def module_available(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def hf_cached_config(repo_id: str, environ: Mapping[str, str]) -> Path | None:
    """config.json of a hub model already in the local Hugging Face cache (what verl would download), if any."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id):
        return None
    base = hf_model_cache_dir(repo_id, environ)
    try:
        ref = (base / "refs" / "main").read_text().strip()
        cfg = base / "snapshots" / ref / "config.json"
        if cfg.is_file():
            return cfg
        return next(iter(sorted(base.glob("snapshots/*/config.json"))), None)
    except OSError:
        return None


CACHE_DIR_ENV = "GRPO_LAB_CACHE_DIR"  # grpo-lab's cache folder (verl's schema, prompt lengths); else ~/.cache/grpo-lab


def cache_dir() -> Path:
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "grpo-lab"


PROMPT_ROWS = 5000  # prompt lengths are measured on the first rows of the train files, at most this many


def prompt_lengths(tokenizer_dir: str, files: tuple[str, ...], key: str, kwargs: Mapping[str, Any]) -> list[int] | None:
    """Token lengths of the first PROMPT_ROWS prompts as verl's RLHFDataset measures them (the chat template with the
    generation prompt, utils/dataset/rl_dataset.py doc2len); None: the tokenizer or a file is not local. Kept on disk
    per version of the files, and found again by their contents (transformers' import alone takes seconds)."""
    tok = [os.path.join(tokenizer_dir, n) for n in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")]
    tok = [p for p in tok if os.path.isfile(p)]
    if not tok or tok[0].endswith(".jinja") or not all(f.endswith(".parquet") and os.path.isfile(f) for f in files):
        return None
    folder, asked = cache_dir() / "prompt_lengths", [key, sorted(kwargs.items()), PROMPT_ROWS]
    # found by the files' paths, sizes and times (no file read); else by their contents (the same tokenizer and data
    # written again or elsewhere: a fresh `make tiny`, a copy): kept under both
    stamp = json.dumps([[(p, os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in (*tok, *files)], *asked],
                       default=str)
    path = folder / f"{hashlib.sha256(stamp.encode()).hexdigest()[:24]}.json"
    if path.is_file():
        return json.loads(path.read_text()) or None
    contents = json.dumps([[(os.path.basename(p), _digest(p)) for p in tok], [_digest(f) for f in files], *asked],
                          default=str)
    same = folder / f"c-{hashlib.sha256(contents.encode()).hexdigest()[:24]}.json"
    if same.is_file():
        text = same.read_text()
        atomic_write(path, text)
        return json.loads(text) or None
    try:
        import pyarrow.parquet as pq
        from transformers import AutoTokenizer

        t = AutoTokenizer.from_pretrained(tokenizer_dir)
        first = [next(pq.ParquetFile(f).iter_batches(PROMPT_ROWS, columns=[key])).column(0) for f in files]
        rows = [r for col in first for r in col.to_pylist()][:PROMPT_ROWS]
        texts = [t.apply_chat_template(r, add_generation_prompt=True, tokenize=False, **kwargs) for r in rows]
        lengths = [len(ids) for ids in t(texts, add_special_tokens=False)["input_ids"]]
    except Exception:  # no chat template, no such column: verl's own errors there, and other rules'
        lengths = []
    atomic_write(same, json.dumps(lengths))
    atomic_write(path, json.dumps(lengths))
    return lengths or None


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
