"""Facts grpo-lab reads in more than one place, written once: the Ray CPU formula, the Hugging Face cache path,
atomic file writes, and what the machine, the files and the config folder say (cheaply: no torch, verl, ray).

What each function gives: docs/cli.md."""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import itertools
import json
import math
import os
import re
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

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
    queue = f" + 1 TransferQueue controller + {storage_units} storage units" if use_v1 else ""
    return f"{CPUS_PER_GPU} per GPU x {gpus_per_node} + 1 TaskRunner{queue}"


# ---------------------------------------------------------------------------------------------------------------
# the Hugging Face cache (huggingface_hub's rule: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)

def hf_model_cache_dir(repo_id: str, environ: Mapping[str, str]) -> Path:
    home = environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(environ.get("HF_HUB_CACHE") or os.path.join(home, "hub")) / ("models--" + repo_id.replace("/", "--"))


# ---------------------------------------------------------------------------------------------------------------
# atomic writes

def umask() -> int:
    """This process's umask (the os module reads it only by setting it: set, then set back)."""
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
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600; the file gets the mode a plain open() would give
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return path


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """`data` as indented JSON (anything else as its str), written whole or not at all (atomic_write)."""
    return atomic_write(path, json.dumps(data, indent=2, default=str) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# YAML files as written: a run folder's .hydra/*.yaml; conf/'s files as the layers grpo_lab/cli/ tells apart

def load_yaml(path: str | os.PathLike) -> Any:
    """A YAML file's data (libyaml's safe loader where there is one)."""
    return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_yaml_or(path: str | os.PathLike, default: Any) -> Any:
    """load_yaml, or `default` when the file is unreadable, not YAML, or empty."""
    try:
        return load_yaml(path) or default
    except (OSError, yaml.YAMLError):
        return default


def load_json_or(path: str | os.PathLike, default: Any, encoding: str | None = None) -> Any:
    """A JSON file's data, or `default` when the file is unreadable or not JSON (encoding None: the locale's)."""
    try:
        return json.loads(Path(path).read_text(encoding=encoding))
    except (OSError, ValueError):
        return default


# ---------------------------------------------------------------------------------------------------------------
# conf/'s config groups, composed by Hydra (its compose API follows the defaults lists, `# @package` headers and
# overrides of other groups): what `python run.py GROUP=OPTION` adds to the config, interpolations as written

CONF = ROOT / "conf"
# the primary config each option is composed in (Hydra's ConfigStore): conf/config.yaml's groups, none chosen
GROUPS_ROOT = "grpo_lab_conf_groups"
_COMPOSED: dict[tuple[str, str], dict[str, Any] | None] = {}  # (group, option) -> composed, None: it does not compose
_OPTIONS: dict[str, tuple[str, ...]] = {}  # group -> its options in conf/; "" -> the groups
_COMPOSING = threading.RLock()
_CONF_HYDRA: list[Any] = []  # [conf/'s Hydra (set up by the compose API), conf/'s config source], once per process
_SESSION: list[Any] = []  # conf/'s config source while _conf_hydra is set up


@contextlib.contextmanager
def _conf_hydra() -> Iterator[Any]:
    """Hydra's compose API on conf/ (GROUPS_ROOT stored), however deep it nests; yields conf/'s config source. The
    Hydra there before (run.py's app) is put back after, and the version_base."""
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType
    from hydra.core.utils import JobRuntime

    from grpo_lab.verl_schema.hydra_internals import own_version_base, version_base_as

    if _SESSION:
        yield _SESSION[-1]
        return
    gh = GlobalHydra.instance()
    running = gh.hydra
    gh.clear()
    try:
        with version_base_as(own_version_base()):
            if _CONF_HYDRA:
                gh.initialize(_CONF_HYDRA[0])
            else:  # the job name stays the app's (Hydra names a sweep's later jobs by it)
                initialize_config_dir(str(CONF), job_name=JobRuntime.instance().get("name"), version_base=None)
                source = next(s for s in gh.config_loader().get_sources() if s.provider == "main")
                groups = [g for g in source.list("", ObjectType.GROUP) if g != "hydra"]
                picked = OmegaConf.to_container(source.load_config("config").config).get("defaults") or []
                order = [k for entry in picked if isinstance(entry, dict) for k in entry if k in groups]
                _OPTIONS[""] = (*order, *sorted(g for g in groups if g not in order))
                ConfigStore.instance().store(name=GROUPS_ROOT, node={
                    "defaults": [{g: None} for g in _OPTIONS[""]] + ["_self_"]})
                _CONF_HYDRA[:] = [gh.hydra, source]
            _SESSION.append(_CONF_HYDRA[1])
            yield _CONF_HYDRA[1]
    finally:
        _SESSION.clear()
        gh.clear()
        if running is not None:
            gh.initialize(running)


def _compose(config_name: str, overrides: list[str]) -> dict[str, Any] | None:
    """Hydra's composition (inside _conf_hydra), without its `hydra` node, as plain data; None: it does not compose."""
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(compose(config_name, overrides=overrides), resolve=False)
    except (HydraException, OmegaConfBaseException, OSError, ValueError):
        return None


def conf_groups() -> tuple[str, ...]:
    """conf/'s config groups (Hydra's own, hydra/, aside), in the order conf/config.yaml's defaults list picks them."""
    with _COMPOSING:
        if "" not in _OPTIONS:
            with _conf_hydra():
                pass
        return _OPTIONS[""]


def option_names(group: str) -> tuple[str, ...]:
    """A conf/ group's options, in name order (none composed)."""
    with _COMPOSING:
        if group not in _OPTIONS:
            from hydra.core.object_type import ObjectType

            with _conf_hydra() as source:
                _OPTIONS[group] = tuple(sorted(source.list(group, ObjectType.CONFIG)))
        return _OPTIONS[group]


def conf_options(group: str, options: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """{option: what `python run.py GROUP=OPTION` adds to the config} for these options of a conf/ group (None: all
    its options, in name order); an option that does not compose is left out. Each is composed once per process."""
    with _COMPOSING:
        names = tuple(options) if options is not None else option_names(group)
        if any((group, o) not in _COMPOSED for o in names):
            with _conf_hydra():
                for o in names:
                    if (group, o) not in _COMPOSED:
                        _COMPOSED[group, o] = _compose(GROUPS_ROOT, [f"{group}={o}"])
        return {o: copy.deepcopy(_COMPOSED[group, o]) for o in names if _COMPOSED[group, o] is not None}


def conf_option(group: str, option: str) -> dict[str, Any]:
    """conf_options of one option; {}: no such option, or it does not compose."""
    return conf_options(group, [option]).get(option, {})


def _lab(doc: Mapping[str, Any], section: str) -> dict[str, Any]:
    """A composed option's lab.<section>, or {}."""
    lab = doc.get("lab")
    value = lab.get(section) if isinstance(lab, dict) else None
    return value if isinstance(value, dict) else {}


@functools.cache
def _conf_text() -> str:
    """Every YAML file under conf/, read once per process (as the options composed above are)."""
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(CONF.rglob("*.yaml")))


def model_group(path: str, chosen: str = "") -> dict[str, Any] | None:
    """The lab.model of the conf/model option whose model_path or hub_id is `path` (as written, with
    `${hydra:runtime.cwd}` put in; another interpolation is no match): the option `chosen` when it is one, else the
    first in name order; None."""
    def plans(doc: Mapping[str, Any]) -> bool:
        model = _lab(doc, "model")
        # Hydra's launch folder is the working directory (conf/config.yaml: hydra.job.chdir false)
        written = str(doc.get("model_path") or "").replace("${hydra:runtime.cwd}", os.getcwd())
        return bool(path and model.get("name") and path in (written, model.get("hub_id")))

    def docs() -> Iterator[dict[str, Any]]:  # one at a time: the chosen one, then the others until one plans it
        for name in dict.fromkeys(filter(None, (chosen, *option_names("model")))):
            yield from conf_options("model", [name]).values()

    # a path written in no conf/ file (your own folder) is planned by no option: nothing to compose
    if not path or path not in _conf_text().replace("${hydra:runtime.cwd}", os.getcwd()):
        return None
    return next((_lab(doc, "model") for doc in docs() if plans(doc)), None)


def model_group_of_folder(folder: str) -> dict[str, Any] | None:
    """The lab.model of the conf/model option whose model_path ends in this folder name (a recorded job's model
    folder, e.g. /tmp/w/data/smollm2-135m-instruct), else None."""
    return next((_lab(doc, "model") or None for doc in conf_options("model").values()
                 if str(doc.get("model_path") or "").rstrip("/").rsplit("/", 1)[-1] == folder), None)


def hardware_card_gb(name: str) -> float | None:
    """lab.hardware.gpu_memory_gb of `python run.py hardware=NAME` (its defaults list followed), when positive; None."""
    gb = _lab(conf_option("hardware", name), "hardware").get("gpu_memory_gb")
    return float(gb) if isinstance(gb, (int, float)) and not isinstance(gb, bool) and gb > 0 else None


# the key grpo_lab.tasks.qwen3_random writes into config.json: its value starts "random weights: memory and speed only"
RANDOM_WEIGHTS_KEY = "grpo_lab_random_weights"


def random_weights_mark(config: Mapping[str, Any] | str | os.PathLike | None) -> str:
    """The mark of a model with random weights ("random weights: memory and speed only: ..."), or "": from a
    config.json mapping, or from a model folder / its config.json path."""
    if config is not None and not isinstance(config, Mapping):
        path = Path(os.path.expanduser(str(config)))
        path = path / "config.json" if path.is_dir() else path
        config = load_json_or(path, {}) if path.name == "config.json" else {}
    mark = (config or {}).get(RANDOM_WEIGHTS_KEY) if isinstance(config, Mapping) else None
    return mark if isinstance(mark, str) and mark else ""


@functools.cache
def preset_learning_rates() -> tuple[tuple[float, str], ...]:
    """The actor learning rates (actor_lr, or verl's actor_rollout_ref.actor.optim.lr) that conf/config.yaml with no
    group option composes to, and each option of conf/'s groups: ((value, file relative to the repository), ...),
    lowest first."""
    with _COMPOSING, _conf_hydra():
        docs = [("conf/config.yaml", _compose("config", [f"~{g}" for g in conf_groups()]) or {})]
        docs += [(f"conf/{g}/{o}.yaml", doc) for g in conf_groups() for o, doc in conf_options(g).items()]
    out = []
    for name, doc in docs:
        optim = ((doc.get("actor_rollout_ref") or {}).get("actor") or {}).get("optim") or {}
        for v in (doc.get("actor_lr"), optim.get("lr") if isinstance(optim, dict) else None):
            if v is not None and not isinstance(v, bool):
                with contextlib.suppress(TypeError, ValueError):  # an interpolation (${actor_lr})
                    out.append((float(v), name))
    return tuple(sorted(out))


# ---------------------------------------------------------------------------------------------------------------
# files and the machine, cheaply

def local_files(value: Any) -> list[str] | None:
    """Local paths of data.train_files / val_files (a string or a list); None when any is remote (hdfs://, s3://)."""
    items = [str(i) for i in (value if isinstance(value, (list, tuple)) else [value]) if i is not None]
    if any("://" in s and not s.startswith("file://") for s in items):
        return None
    return [os.path.expanduser(s.removeprefix("file://")) for s in items]


def parquet_num_rows(path: str | os.PathLike) -> int:
    """Row count from a parquet file's footer (FileMetaData.num_rows, no rows read). The path is opened as a plain
    file: pyarrow given the path would also resolve a file:// URI."""
    with open(path, "rb") as f:  # first: a file that is not there imports nothing
        import pyarrow.parquet as pq  # ~0.15 s: the preflight imports it anyway to read a local parquet's schema

        return int(pq.ParquetFile(f).metadata.num_rows)


def _proc_gpus() -> int | None:
    try:
        return len([e for e in os.listdir("/proc/driver/nvidia/gpus") if not e.startswith(".")])
    except OSError:
        return None


def _smi_gpus() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else None


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
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    return n


def installed_version(dist: str) -> tuple[int, ...] | None:
    """The installed distribution's version as numbers (read from its metadata, nothing imported); None: absent."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version(dist)
    except PackageNotFoundError:
        return None
    digits = ("".join(filter(str.isdigit, part)) for part in v.split(".")[:3])
    return tuple(int(d) for d in itertools.takewhile(bool, digits))


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
        return cfg if cfg.is_file() else min(base.glob("snapshots/*/config.json"), default=None)
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
    h = hashlib.sha256()  # hashlib.file_digest is Python 3.11+; pyproject.toml allows 3.10
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
