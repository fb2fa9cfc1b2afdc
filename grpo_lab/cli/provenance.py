"""Changed defaults, never silent: every value of a job's verl config that differs from verl's own default, with verl's
value, ours, and what set it (a file under conf/, the command line, or an environment variable). How: docs/cli.md."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from grpo_lab.cli.overrides import CONF_DIR, our_groups, parse_overrides, verl_tree
from grpo_lab.facts import RAY_ENV_VARS, load_yaml
from grpo_lab.verl_keys import MISSING, lookup, merge, put

_RESOLVER_ARG_REF = re.compile(r"\$\{(?:[\w.]+:)?([\w.]+)")

# set per job by grpo_lab/launch/job.py, not by a config layer
LAUNCH_KEYS = tuple(f"{RAY_ENV_VARS}.{name}" for name in ("VERL_FILE_LOGGER_PATH", "WANDB_DIR", "WANDB_MODE",
                                                          "VLLM_USE_FLASHINFER_SAMPLER"))


def verl_defaults() -> dict[str, Any]:
    """verl's composed ppo_trainer, resolved: what verl would run with given nothing (read-only)."""
    from grpo_lab.verl_schema import schema

    return schema().defaults


class Layers:
    """The config layers of one job, lowest first: [(name, nested data)]."""

    def __init__(self, choices: Mapping[str, Any], task_overrides: Sequence[str],
                 env_overrides: Mapping[str, str] | None = None, conf_dir: Path = CONF_DIR) -> None:
        self.layers: list[tuple[str, dict]] = []
        conf_dir = Path(conf_dir)
        self._add("conf/config.yaml", load_yaml(conf_dir / "config.yaml"))
        ours = our_groups(conf_dir)
        for group, choice in choices.items():
            if choice in ours.get(group, ()):  # an option file of ours
                self._add(f"conf/{group}/{choice}.yaml", option_data(conf_dir / group / f"{choice}.yaml", conf_dir))
        env_overrides = env_overrides or {}
        # by key too: a sweep job's override is one value of the environment's list (ROLLOUT_GPU_MEM_UTIL=0.3,0.4 -m)
        env_keys = {t.split("=", 1)[0]: name for t, name in env_overrides.items()}
        self.env: dict = {}
        self.cli: dict = {}
        for text in task_overrides:
            try:
                (o,) = parse_overrides([text])
            except Exception:
                continue
            if o.is_delete() or "/" in o.key_or_group or o.key_or_group in ours:
                continue
            name = env_overrides.get(text) or env_keys.get(o.key_or_group)
            put(self.env if name else self.cli, o.key_or_group,
                (f"environment ({name})" if name else "command line", o.value()))

    def _add(self, name: str, data: Any) -> None:
        if isinstance(data, dict):
            self.layers.append((name, {k: v for k, v in data.items() if k not in ("defaults", "hydra")}))

    def set_by(self, key: str, depth: int = 0) -> tuple[int, str] | None:
        """(precedence, what set it) of the highest layer that sets `key`, following interpolations."""
        # overrides as layers whose leaves are (what set it, value); name "" marks them
        for i, (name, data) in reversed(list(enumerate([*self.layers, ("", self.env), ("", self.cli)]))):
            raw = lookup(data, key)
            if raw is MISSING:
                continue
            if isinstance(raw, tuple) and len(raw) == 2 and isinstance(raw[0], str) and name == "":
                return i, raw[0]
            if isinstance(raw, str) and "${" in raw and depth < 4:
                # the keys it reads (a resolver's name, `${lab_packed:${...}}`, is none)
                refs = [r for r in _RESOLVER_ARG_REF.findall(raw)
                        if not r.startswith("hydra") and not OmegaConf.has_resolver(r)]
                found = [(s, r) for r in refs if (s := self.set_by(r, depth + 1))]
                if found:
                    best, ref = max(found, key=lambda f: f[0][0])
                    if best[0] > i:  # what it reads was set higher up than the interpolation
                        return best[0], best[1] if best[1].endswith(")") else f"{best[1]} ({ref})"
            return i, name
        return None

    def source(self, key: str) -> str:
        """What set `key` (plan.json's changed_defaults "set_by"): a layer, an override, or a verl interpolation."""
        if key in LAUNCH_KEYS:
            return "grpo_lab/launch/job.py (per job)"
        found = self.set_by(key)
        if found is not None:
            return found[1]
        parts = key.split(".")
        for n in range(len(parts) - 1, 0, -1):  # an override that set a whole section: +x={a:1}
            for data in (self.cli, self.env):
                raw = lookup(data, ".".join(parts[:n]))
                if isinstance(raw, tuple):
                    return raw[0]
        raw = lookup(verl_tree(), key)
        refs = _RESOLVER_ARG_REF.findall(raw) if isinstance(raw, str) else []
        return f"verl: follows {', '.join(refs)}" if refs else "verl (follows a value set above)"


def option_data(path: Path, conf_dir: Path, depth: int = 0) -> Any:
    """An option file's data over what its own defaults list pulls in, as Hydra merges them (docs/cli.md)."""
    data = load_yaml(path)
    if not isinstance(data, dict) or depth > 8:
        return data
    names = [e for e in data.get("defaults") or [] if isinstance(e, str)]
    out: dict = {}
    for name in names if "_self_" in names else [*names, "_self_"]:
        if name == "_self_":
            merge(out, {k: v for k, v in data.items() if k != "defaults"})
            continue
        sub = (conf_dir / name.lstrip("/") if name.startswith("/") else path.parent / name).with_name(
            f"{Path(name).name}.yaml")
        if sub.is_file():
            merge(out, option_data(sub, conf_dir, depth + 1))
    return out


def job_layers(env_names: Mapping[str, str] | None = None) -> Layers:
    """The config layers of the running Hydra job; `env_names`: override -> the environment variable it came from."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    return Layers(dict(hc.runtime.choices), list(hc.overrides.task), dict(env_names or {}))
