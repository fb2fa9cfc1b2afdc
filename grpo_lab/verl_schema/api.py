"""verl_schema's public API, `schema()`: verl's schema as one object, read once per verl version; where it is read
from, and every attribute of the schema object: docs/verl_schema.md."""

from __future__ import annotations

import logging
import os
import pickle
from typing import Any

log = logging.getLogger(__name__)


class VerlSchema:
    """verl's schema from one document of verl_cache (see the module doc for each attribute)."""

    def __init__(self, doc: dict[str, Any], *, config_dir: str | None, origin: str) -> None:
        self.config_dir = config_dir
        self.origin = origin
        self.version = str(doc.get("verl") or "unknown")
        self.problems: dict[str, str] = dict(doc.get("problems") or {})
        self.tree: dict[str, Any] = doc.get("tree") or {}
        self.defaults: dict[str, Any] = doc.get("defaults") or {}
        self.serves_hydra = bool(doc.get("serves_hydra")) and bool(self.tree)
        self.version_base = doc.get("version_base")  # the version_base the tree was composed with
        self._fields: dict[str, Any] = doc.get("fields") or {}
        model = doc.get("model_keys") or {}
        self.model_keys = frozenset(model.get("keys") or ())
        self.model_keys_from = str(model.get("from") or self._why("model_keys"))
        rollout = doc.get("rollout_engines") or {}
        self.rollout_engines = frozenset((str(n), str(m)) for n, m in rollout.get("pairs") or ())
        self.rollout_servers = frozenset(str(n) for n in rollout.get("names") or ())
        self.rollout_from = str(rollout.get("from") or self._why("rollout_engines", "verl's rollout registries"))
        sources = doc.get("data_sources")
        self.data_sources = frozenset(sources["names"]) if sources else None
        self.data_source_prefixes = tuple(sources["prefixes"]) if sources else ()
        self._pickled: bytes | None = None

    def _why(self, part: str, what: str = "") -> str:
        if self.origin == "none":
            return "verl is not installed"
        return f"{what or part} could not be read: {self.problems.get(part) or self.problems.get('objects', '?')}"

    def fields(self, target: str) -> frozenset[str] | None:
        names = self._fields.get(target)
        return frozenset(names) if names is not None else None

    def knows_data_source(self, name: str) -> bool | None:
        if self.data_sources is None:
            return None
        return name in self.data_sources or name.startswith(self.data_source_prefixes)

    def composed(self) -> Any:
        """A fresh DictConfig of the composed ppo_trainer (no defaults list left; a copy per compose, unpickled), or
        None (also in an app of another version_base): then Hydra composes verl's files (docs/verl_schema.md)."""
        from grpo_lab.verl_schema.hydra_internals import version_base

        if not self.serves_hydra or self.version_base != version_base():
            return None
        if self._pickled is None:
            from omegaconf import OmegaConf

            cfg = OmegaConf.create(self.tree)
            self._pickled = pickle.dumps(cfg)
            return cfg
        return pickle.loads(self._pickled)


# verl's config folder -> its schema, for this process
_SCHEMAS: dict[str, VerlSchema] = {}


def schema(config_dir: str | os.PathLike | None = None) -> VerlSchema:
    """verl's schema for its config folder (default: the installed verl's); never raises."""
    from grpo_lab.verl_schema.verl_paths import verl_config_dir

    root = str(config_dir) if config_dir is not None else verl_config_dir()
    if root is None:
        return VerlSchema({}, config_dir=None, origin="none")
    from grpo_lab.verl_schema import verl_cache

    memo = os.path.realpath(root)
    if memo not in _SCHEMAS:
        try:
            loaded = verl_cache.load(root)
            _SCHEMAS[memo] = VerlSchema(loaded.doc, config_dir=root, origin=loaded.origin)
        except Exception as e:  # never worse than no schema: Hydra reads verl's files, the checks that need it say so
            log.warning("grpo-lab: verl's schema not read: %s: %s", type(e).__name__, e)
            _SCHEMAS[memo] = VerlSchema({"problems": {"objects": f"{type(e).__name__}: {e}"}}, config_dir=root,
                                        origin="error")
    return _SCHEMAS[memo]


def cache_clear() -> None:
    """Forget this process's schemas: the next schema() reads the cache file again (or builds it)."""
    _SCHEMAS.clear()
