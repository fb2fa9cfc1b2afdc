"""The builder of verl's schema, `python -m grpo_lab.verl_schema.build CONFIG_DIR OUT VERSION_BASE`: run in a child
process, it imports verl and reads its objects, once per verl version. Each part it writes: docs/verl_schema.md."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from grpo_lab.facts import load_yaml

CONFIG_NAME = "ppo_trainer"
MODEL_FILE = ("model", "hf_model.yaml")


def yaml_files(config_dir: str) -> list[str]:
    """verl's config files, folder by folder in name order (the schema cache's key stamps each)."""
    out = []
    for root, dirs, files in os.walk(config_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".yaml")]
    return out


def stamp(path: str) -> list[int]:
    """[mtime_ns, size]: what tells the schema cache that a file changed."""
    st = os.stat(path)
    return [st.st_mtime_ns, st.st_size]


def _json_exact(data: Any) -> bool:
    try:
        return json.loads(json.dumps(data)) == data
    except (TypeError, ValueError):
        return False


def _no_tree(problem: str) -> dict[str, Any]:
    return {"tree": None, "serves_hydra": False, "defaults": None, "problems": {"tree": problem}}


def compose_tree(config_dir: str, version_base: str) -> dict[str, Any]:
    """{tree, serves_hydra, defaults, problems}: Hydra's composition of verl's ppo_trainer and its resolved values."""
    from omegaconf import OmegaConf, open_dict

    from grpo_lab.verl_schema import hydra_internals

    sets_hydra = [p for p in yaml_files(config_dir)
                  if re.search(r"^hydra\s*:", Path(p).read_text(encoding="utf-8"), re.M)]
    with hydra_internals.version_base_as(version_base):
        cfg = hydra_internals.compose_folder(config_dir, CONFIG_NAME)
    with open_dict(cfg):
        del cfg["hydra"]
    tree = OmegaConf.to_container(cfg, resolve=False)
    if not _json_exact(tree):
        return _no_tree("verl's composed config holds something JSON does not carry exactly")
    try:
        defaults = OmegaConf.to_container(OmegaConf.create(tree), resolve=True, throw_on_missing=False)
    except Exception:  # an interpolation verl resolves only with more context: the raw values
        defaults = tree
    problems = {"serves_hydra": f"{sets_hydra[0]} sets Hydra's own node"} if sets_hydra else {}
    return {"tree": tree, "serves_hydra": not sets_hydra, "defaults": defaults if _json_exact(defaults) else tree,
            "problems": problems}


def targets(config_dir: str, tree: Any) -> list[str]:
    """Every `_target_` value in the composed tree and in verl's config files (every group option's too)."""
    found: dict[str, None] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "_target_" and isinstance(v, str):
                    found.setdefault(v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(tree)
    for path in yaml_files(config_dir):
        try:
            walk(load_yaml(path))
        except Exception:
            continue
    return sorted(found)


def _dataclass(target: str, seen_files: set[str]) -> Any:
    """verl's dataclass a `_target_` names (its files and its bases' noted in seen_files), or None."""
    module, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception:  # not importable here (an optional dependency, a recipe outside verl): not known
        return None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return None
    seen_files.update(path for c in cls.__mro__ if c.__module__.split(".")[0] == "verl"
                      and (path := getattr(sys.modules.get(c.__module__), "__file__", None)))
    return cls


def dataclass_fields(names: list[str], seen_files: set[str]) -> dict[str, list[str] | None]:
    classes = {target: _dataclass(target, seen_files) for target in names}
    return {t: sorted(f.name for f in dataclasses.fields(c)) if c else None for t, c in classes.items()}


def model_keys(config_dir: str, seen_files: set[str]) -> dict[str, Any]:
    """The keys verl takes under actor_rollout_ref.model: model/hf_model.yaml's and its `_target_` dataclass's
    fields."""
    import verl

    node = load_yaml(Path(config_dir).joinpath(*MODEL_FILE)) or {}
    target = node.get("_target_")
    cls = _dataclass(target, seen_files) if isinstance(target, str) else None
    if cls is None:
        raise LookupError(f"{'/'.join(MODEL_FILE)} names no dataclass verl has ({target!r})")
    where = os.path.relpath(sys.modules[cls.__module__].__file__, os.path.dirname(os.path.dirname(verl.__file__)))
    keys = set(node) | {f.name for f in dataclasses.fields(cls)}
    return {"keys": sorted(k for k in keys if not str(k).startswith("__")),
            "from": f"verl/trainer/config/{'/'.join(MODEL_FILE)} + {cls.__name__} in {where}"}


def rollout_engines(seen_files: set[str]) -> dict[str, Any]:
    """verl 0.9.1: the worker's registry (base.py's _ROLLOUT_REGISTRY: get_rollout_class asserts the (name, mode) pair
    is there) and the server's (RolloutReplicaRegistry: get raises 'Unknown rollout mode'), read, never changed."""
    from verl.workers.rollout import base, replica

    seen_files.update([base.__file__, replica.__file__])
    return {"pairs": sorted([n, m] for n, m in base._ROLLOUT_REGISTRY),
            "names": sorted(replica.RolloutReplicaRegistry._registry),
            "from": "verl/workers/rollout/base.py _ROLLOUT_REGISTRY + replica.py RolloutReplicaRegistry"}


class _Probe(str):
    """A data_source that records what it is compared with (==, `in` a list or tuple, startswith) and matches none."""

    __hash__ = str.__hash__

    def __new__(cls, names: set[str], prefixes: list[str]) -> _Probe:
        probe = super().__new__(cls, "\x00grpo-lab probe\x00")
        probe.names, probe.prefixes = names, prefixes
        return probe

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            self.names.add(str(other))
        return False

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def startswith(self, prefix: Any, *args: Any) -> bool:
        self.prefixes.extend([prefix] if isinstance(prefix, str) else [str(p) for p in prefix])
        return False


def scorer_sources(score: Any) -> dict[str, Any]:
    """{names, prefixes} a scorer (verl's default_compute_score) dispatches on, probed: docs/verl_schema.md."""
    names: set[str] = set()
    prefixes: list[str] = []
    try:
        score(_Probe(names, prefixes), "", "")
    except NotImplementedError:
        return {"names": sorted(names), "prefixes": list(dict.fromkeys(prefixes))}
    raise RuntimeError(f"{getattr(score, '__name__', score)} took a data_source it cannot know without raising "
                       f"NotImplementedError")


def data_sources(seen_files: set[str]) -> dict[str, Any]:
    import verl.utils.reward_score as scores

    seen_files.add(scores.__file__)
    return scorer_sources(scores.default_compute_score)


def build(config_dir: str, version_base: str, *, objects: bool = True) -> dict[str, Any]:
    """The whole document (see the module doc). objects=False: the Hydra part only, verl never imported."""
    try:
        out = compose_tree(config_dir, version_base)
    except Exception as e:  # Hydra cannot compose verl's files: the plugin then hands them to Hydra as they are
        out = _no_tree(f"{type(e).__name__}: {e}")
    out.update({"fields": None, "model_keys": None, "rollout_engines": None, "data_sources": None, "sources": {}})
    if not objects:
        out["problems"]["objects"] = "verl's objects were not read"
        return out
    seen: set[str] = set()
    parts = [("fields", lambda: dataclass_fields(targets(config_dir, out["tree"]), seen)),
             ("model_keys", lambda: model_keys(config_dir, seen)),
             ("rollout_engines", lambda: rollout_engines(seen)),
             ("data_sources", lambda: data_sources(seen))]
    for name, read in parts:
        try:
            out[name] = read()
        except Exception as e:  # that part stays unknown; the rules that need it say they could not check
            out["problems"][name] = f"{type(e).__name__}: {e}"
    out["sources"] = {path: stamp(path) for path in sorted(seen)}
    try:
        import verl

        out["verl_version"] = getattr(verl, "__version__", "unknown")
    except Exception as e:
        out["problems"]["verl"] = f"{type(e).__name__}: {e}"
    return out


if __name__ == "__main__":
    config_dir, out_path, version_base = sys.argv[1:]
    Path(out_path).write_text(json.dumps(build(config_dir, version_base)), encoding="utf-8")
