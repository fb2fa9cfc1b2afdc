"""verl's `ppo_trainer` config composed once and kept, so that Hydra reads one file instead of verl's ~40.

Composing verl/trainer/config/ppo_trainer.yaml through its defaults lists takes ~1 s on a small CPU, and `python
run.py` composes twice (Hydra's mode detection, then the run). verl's files change only when verl does, so
hydra_plugins/grpo_lab_searchpath serves `ppo_trainer` from here: the config Hydra composes from verl's files, not
resolved, stored as one YAML file. The config a job gets is the same key for key, in the same order
(tests/test_verl_searchpath.py compares them); only Hydra's record of the group choices it walked
(hydra.runtime.choices in .hydra/hydra.yaml) no longer lists verl's.

    cache key:  this format, verl's version, Hydra's and OmegaConf's versions, Hydra's version_base, verl's config
                folder and every YAML file in it (path, mtime, size); a changed verl gets a new file (~40 KB each;
                old ones stay until deleted)
    where:      $GRPO_LAB_CACHE_DIR, else $XDG_CACHE_HOME/grpo-lab, else ~/.cache/grpo-lab; written as a temp file
                and renamed. Where it cannot be written, the composed config serves this process only.
    off:        GRPO_LAB_VERL_CACHE=0, and by itself for a command line that needs verl's own defaults tree
                (tree_needed): an option of one of verl's config groups (model_engine=megatron,
                actor@actor_rollout_ref.actor=veomni_actor, ~model_engine), --info, --cfg hydra|all, --config-dir,
                hydra.searchpath. Set it by hand when a config file of yours picks an option of a verl group, or a
                config folder of yours replaces one of verl's files: the cached ppo_trainer has no defaults list
                left to override (Hydra: "Could not override 'model_engine'. No match in the defaults list").

Never imports verl (that takes seconds); Hydra, OmegaConf and PyYAML are imported only when a config is composed.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any, Iterator, Sequence

from grpo_lab.facts import atomic_write

ENV = "GRPO_LAB_VERL_CACHE"
DIR_ENV = "GRPO_LAB_CACHE_DIR"
# bump when what is stored changes
FORMAT = 1
CONFIG_NAME = "ppo_trainer"

log = logging.getLogger(__name__)

# (verl config dir, key) -> the composed DictConfig, pickled: Hydra moves the nodes of what it loads into its result,
# so each compose gets its own copy, and unpickling makes one in ~10 ms (deepcopy ~60 ms, OmegaConf.create ~140 ms)
_memo: dict[tuple[str, str], bytes] = {}


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "grpo-lab"


def _yaml_files(verl_dir: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(verl_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".yaml")]
    return out


def _verl_version(verl_dir: str) -> str:
    # verl/trainer/config -> verl/version/version, the file verl's own __init__ reads
    try:
        return Path(verl_dir).parents[1].joinpath("version", "version").read_text().strip()
    except OSError:
        return "unknown"


def cache_key(verl_dir: str) -> str:
    import hydra
    import omegaconf
    from hydra import version

    base = version.getbase()
    if not isinstance(base, version.Version):  # not set yet: Hydra takes its compatibility base
        base = version.__compat_version__
    parts = [f"format={FORMAT}", f"verl={_verl_version(verl_dir)}", f"hydra={hydra.__version__}",
             f"omegaconf={omegaconf.__version__}", f"version_base={base}",
             f"dir={os.path.realpath(verl_dir)}"]
    for path in _yaml_files(verl_dir):
        st = os.stat(path)
        parts.append(f"{os.path.relpath(path, verl_dir)}:{st.st_mtime_ns}:{st.st_size}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def cache_file(verl_dir: str, key: str | None = None) -> Path:
    return cache_dir() / f"verl-{CONFIG_NAME}-{(key or cache_key(verl_dir))[:24]}.yaml"


def composed_ppo_trainer(verl_dir: str) -> Any:
    """A fresh DictConfig of verl's composed ppo_trainer (no defaults list left), or None: then use verl's files."""
    try:
        key = cache_key(verl_dir)
        pickled = _memo.get((verl_dir, key))
        if pickled is None:
            data = _read(cache_file(verl_dir, key), key)
            if data is None:
                data = _build(verl_dir)
                if data is None:
                    return None
                _write(cache_file(verl_dir, key), key, data)
            from omegaconf import OmegaConf

            cfg = OmegaConf.create(data)
            _memo[(verl_dir, key)] = pickle.dumps(cfg)
            return cfg
        return pickle.loads(pickled)
    except Exception as e:  # never worse than no cache
        log.debug("grpo-lab: verl config cache not used: %s: %s", type(e).__name__, e)
        return None


def _yaml() -> tuple[Any, Any, Any]:
    import yaml

    return yaml, getattr(yaml, "CSafeLoader", yaml.SafeLoader), getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _read(path: Path, key: str) -> dict | None:
    yaml, loader, _ = _yaml()
    try:
        doc = yaml.load(path.read_text(), Loader=loader)
    except (OSError, ValueError, yaml.YAMLError):  # absent, not text, not YAML: built again
        return None
    if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get(CONFIG_NAME), dict):
        return None
    return doc[CONFIG_NAME]


def _write(path: Path, key: str, data: dict) -> None:
    """Atomically (temp file + rename); a cache that cannot be written is skipped."""
    yaml, _, dumper = _yaml()
    text = (f"# grpo-lab: verl's {CONFIG_NAME} as Hydra composes it from verl's files (grpo_lab/verl_schema/verl_cache.py); "
            "a cache, safe to delete\n"
            + yaml.dump({"key": key, CONFIG_NAME: data}, Dumper=dumper, sort_keys=False, allow_unicode=True))
    try:
        atomic_write(path, text)
    except OSError as e:
        log.debug("grpo-lab: verl config cache not written (%s): %s", path, e)


def _build(verl_dir: str) -> dict | None:
    """Hydra's composition of verl's ppo_trainer (verl's folder alone on the search path), as plain data."""
    for path in _yaml_files(verl_dir):
        if re.search(r"^hydra\s*:", Path(path).read_text(), re.M):
            return None  # a verl file that sets Hydra's own node: only the real defaults tree places it
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
    from hydra.core.plugins import Plugins
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    Plugins.instance()  # registers Hydra's config sources (pkg://, file://) when no Hydra app has yet
    search_path = ConfigSearchPathImpl()
    search_path.append("hydra", "pkg://hydra.conf")
    search_path.append("main", f"file://{verl_dir}")
    search_path.append("schema", "structured://")
    loader = ConfigLoaderImpl(config_search_path=search_path)
    cfg = loader.load_configuration(config_name=CONFIG_NAME, overrides=[], run_mode=RunMode.RUN)
    with open_dict(cfg):
        del cfg["hydra"]
    data = OmegaConf.to_container(cfg, resolve=False)
    yaml, loader_cls, dumper = _yaml()
    if yaml.load(yaml.dump(data, Dumper=dumper, sort_keys=False), Loader=loader_cls) != data:
        return None  # something YAML does not carry exactly
    return data


def _groups(config_dir: str | os.PathLike) -> set[str]:
    """Config groups at the top of a config folder: its subfolders that hold YAML files."""
    try:
        return {e.name for e in os.scandir(config_dir)
                if e.is_dir() and any(f.endswith(".yaml") for f in os.listdir(e.path))}
    except OSError:
        return set()


def tree_needed(args: "Sequence[str] | Any", conf_dir: str | os.PathLike) -> str | None:
    """The first command-line argument that needs verl's own defaults tree; None when the composed cache serves.

    args: the command line (flags and overrides), or grpo_lab.cli.overrides.CommandLine as run.py parsed it.
    conf_dir: the primary config folder; its groups (model, rollout) share names with verl's, and `model=...` without
    a package is ours.
    """
    from grpo_lab.cli import overrides as ov
    from grpo_lab.verl_schema.verl_paths import verl_config_dir

    if verl_config_dir() is None:
        return None
    cli = args if isinstance(args, ov.CommandLine) else ov.parse(list(args))
    flags = vars(cli.flags)
    if flags.get("info") is not None:
        return _typed(cli.args, ("--info", "-i"))
    if flags.get("cfg") in ("hydra", "all"):
        return _typed(cli.args, ("--cfg", "-c"), flags["cfg"])
    if flags.get("config_dir"):
        return _typed(cli.args, ("--config-dir", "-cd"))
    for o in cli.overrides + ov.parse_overrides(cli.env):
        if o.key_or_group == "hydra.searchpath" or ov.picks_verl_group(o, conf_dir):
            return o.input_line
    return None


def _typed(args: Sequence[str], names: tuple[str, ...], value: str | None = None) -> str:
    """The flag as it was typed (`-c all`, `--cfg=hydra`, `--info`)."""
    for i, a in enumerate(args):
        flag = a.partition("=")[0]
        if flag in names:
            if value is not None and "=" not in a and i + 1 < len(args):
                return f"{a} {args[i + 1]}"
            return a
    return names[0]


@contextlib.contextmanager
def tree_if_needed(args: "Sequence[str] | Any", conf_dir: str | os.PathLike) -> Iterator[str | None]:
    """Within: the cache off (GRPO_LAB_VERL_CACHE=0) if tree_needed(args) says so; yields that argument."""
    arg = tree_needed(args, conf_dir) if enabled() else None
    old = os.environ.get(ENV)
    if arg:
        os.environ[ENV] = "0"
    try:
        yield arg
    finally:
        if arg:
            if old is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = old
