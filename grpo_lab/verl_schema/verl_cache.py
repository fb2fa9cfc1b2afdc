"""The on-disk cache of verl's schema: one JSON file per verl version, built by a child process that imports verl
(never this one). What is kept, the file's name and place, the child, GRPO_LAB_VERL_CACHE=0: docs/verl_schema.md."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from grpo_lab.facts import CACHE_DIR_ENV as DIR_ENV  # noqa: F401 (the tests set it)
from grpo_lab.facts import ROOT, atomic_write, cache_dir, load_json_or
from grpo_lab.verl_schema.build import build, stamp, yaml_files
from grpo_lab.verl_schema.hydra_internals import own_version_base

ENV = "GRPO_LAB_VERL_CACHE"
# bump when what is stored changes
FORMAT = 2
BUILD_TIMEOUT_S = 300
# the parts a document must have, and their JSON types (None allowed where a part could not be read)
PARTS = {"tree": dict, "serves_hydra": bool, "defaults": dict, "fields": dict, "model_keys": dict,
         "rollout_engines": dict, "data_sources": dict, "sources": dict, "problems": dict}
# the parts read from verl's objects: a document that lacks one is not kept (the next process tries again)
OBJECT_PARTS = ("fields", "model_keys", "rollout_engines", "data_sources")

log = logging.getLogger(__name__)


def enabled() -> bool:
    """Whether Hydra gets ppo_trainer composed from the cache (GRPO_LAB_VERL_CACHE, on unless 0/false/no/off)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@contextlib.contextmanager
def off() -> Iterator[None]:
    """Within: GRPO_LAB_VERL_CACHE=0 (Hydra walks verl's own files); after: as it was."""
    old = os.environ.get(ENV)
    os.environ[ENV] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def verl_version(config_dir: str) -> str:
    """verl's version from verl/version/version (the file verl's own __init__ reads), without importing verl."""
    try:
        return Path(config_dir).parents[1].joinpath("version", "version").read_text().strip()
    except (OSError, IndexError):
        return "unknown"


def cache_key(config_dir: str) -> str:
    import hydra
    import omegaconf

    parts = [f"format={FORMAT}", f"verl={verl_version(config_dir)}", f"hydra={hydra.__version__}",
             f"omegaconf={omegaconf.__version__}", f"version_base={own_version_base()}",
             f"dir={os.path.realpath(config_dir)}"]
    parts += [f"{os.path.relpath(path, config_dir)}:{':'.join(map(str, stamp(path)))}"
              for path in yaml_files(config_dir)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def stale_sources(sources: dict[str, Any]) -> list[str]:
    """The files of `sources` ({path: [mtime_ns, size]}) that are gone or changed since."""

    def now(path: str) -> list[int] | None:
        try:
            return stamp(path)
        except OSError:  # gone
            return None

    return [path for path, (mtime_ns, size) in sources.items() if now(path) != [mtime_ns, size]]


def valid(doc: Any, key: str) -> bool:
    """Whether `doc` is a whole document for `key` whose sources are unchanged."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("key") != key or not all(
            part in doc and isinstance(doc[part], (kind, type(None))) for part, kind in PARTS.items()):
        return False
    try:
        return not stale_sources(doc["sources"])
    except (TypeError, ValueError):  # not [mtime, size] pairs
        return False


def read(path: Path, key: str) -> dict | None:
    """The document at `path` if it is valid for `key`; None when absent, unreadable, partial or stale."""
    doc = load_json_or(path, None, encoding="utf-8")  # absent, not text, not JSON (a cut-off write): built again
    return doc if valid(doc, key) else None


def build_in_child(config_dir: str, version_base: str) -> dict | None:
    """`python -m grpo_lab.verl_schema.build` in a child process (it imports verl); its document, or None when it
    failed or ran past BUILD_TIMEOUT_S."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    with tempfile.TemporaryDirectory(prefix="grpo-lab-verl-schema-") as tmp:
        out = Path(tmp) / "schema.json"
        try:
            proc = subprocess.run([sys.executable, "-m", "grpo_lab.verl_schema.build", config_dir, str(out),
                                   version_base], cwd=str(ROOT), env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("grpo-lab: reading verl's schema in a child process failed: %s", e)
            return None
        if proc.returncode != 0:
            log.warning("grpo-lab: reading verl's schema in a child process failed (exit %s): %s", proc.returncode,
                        proc.stderr[-2000:])
            return None
        try:
            doc = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            doc = e
        if not isinstance(doc, dict):
            log.warning("grpo-lab: the child process that reads verl's schema left no document: %s", doc)
            return None
        return doc


class Loaded(NamedTuple):
    doc: dict
    origin: str  # "file" (read from the cache), "built" (by the child, now), "fallback" (Hydra only, this process)


def load(config_dir: str) -> Loaded:
    """verl's schema document for `config_dir`: from the cache file, else built by the child and kept."""
    key = cache_key(config_dir)
    path = cache_dir() / f"verl-schema-{key[:24]}.json"
    doc = read(path, key)
    if doc is not None:
        return Loaded(doc, "file")
    base = own_version_base()
    if sys.stderr is not None and sys.stderr.isatty():  # someone waits at a terminal: say why
        print(f"grpo-lab: reading verl {verl_version(config_dir)}'s schema, once per verl version (a child process "
              f"imports verl: seconds) into {path}", file=sys.stderr, flush=True)
    doc = build_in_child(config_dir, base)
    origin = "built"
    if doc is None:
        doc, origin = build(config_dir, base, objects=False), "fallback"
    doc.update(format=FORMAT, key=key, verl=verl_version(config_dir), version_base=base)
    if origin == "built" and valid(doc, key) and not any(doc[part] is None for part in OBJECT_PARTS):
        try:  # atomically (temp file + rename); where the folder cannot be written the document serves this process
            atomic_write(path, json.dumps(doc))
        except OSError as e:
            log.debug("grpo-lab: verl schema cache not written (%s): %s", path, e)
    return Loaded(doc, origin)
