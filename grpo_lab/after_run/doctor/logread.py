"""The doctor's reading of a log: its lines without Ray's, vLLM's and torch's prefixes, the config verl printed into
it, the job's values from its Run, and the Diagnosis every finding is."""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab import facts, loglines
from grpo_lab.memory.run import Run

# ---------------------------------------------------------------------------------------------------------------------
# the result


@dataclass
class Diagnosis:
    id: str
    title: str
    evidence: str
    remedy: str
    overrides: list[str] = field(default_factory=list)
    line: int | None = None  # 1-based line of the evidence in the log
    phase: str | None = None  # "training" | "generation" for memory and CUDA errors

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        out = [f"[{self.id}] {self.title}", f"  evidence{where}: {self.evidence}"]
        out += ["  " + ln for ln in self.remedy.splitlines()]
        if self.overrides:
            out.append("  try: python run.py ... " + " ".join(shlex.quote(o) for o in self.overrides))
        return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------------
# reading a log

_STEP = re.compile(r"(?:^|\s)step:(\d+) - ")

# a run that finished: its last lines
END_MARKERS = re.compile(r"Final validation metrics|Training Progress: 100%")


@dataclass
class Log:
    raw: list[str]
    clean: list[str]  # prefixes stripped
    procs: list[str]  # the Ray prefix of each line ("" for the driver)

    @classmethod
    def of(cls, text: str) -> Log:
        raw = loglines.split(text)
        procs = [m.group(0) if (m := loglines.RAY_PREFIX.match(line)) else "" for line in raw]
        clean = [loglines.RANK_PREFIX.sub("", loglines.VLLM_PREFIX.sub("", line[len(proc):]))
                 for line, proc in zip(raw, procs)]
        return cls(raw, clean, procs)

    def find(self, pattern: re.Pattern[str]) -> list[int]:
        return [i for i, line in enumerate(self.clean) if pattern.search(line)]

    def first(self, pattern: re.Pattern[str]) -> int | None:
        return next((i for i, line in enumerate(self.clean) if pattern.search(line)), None)

    def evidence(self, i: int) -> str:
        s = self.clean[i].strip()
        return s if len(s) <= 300 else s[:297] + "..."

    def steps(self) -> list[int]:
        return [int(m.group(1)) for line in self.clean if (m := _STEP.search(line))]


def printed_config(log: Log) -> dict[str, Any]:
    """The verl config the TaskRunner pretty-prints at start (a Python dict literal over many prefixed lines)."""
    start = next((i for i, s in enumerate(log.clean) if s.startswith("{'actor_rollout_ref'")), None)
    if start is None:
        return {}
    proc = log.procs[start]
    buf: list[str] = []
    depth = 0
    for i in range(start, min(len(log.clean), start + 5000)):
        if log.procs[i] != proc:
            continue  # another process's line in between
        s = log.clean[i]
        buf.append(s)
        depth += s.count("{") - s.count("}")
        if depth <= 0:
            break
    for sep in ("\n", ""):
        try:
            cfg = ast.literal_eval(sep.join(buf))
            return cfg if isinstance(cfg, dict) else {}
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
    return {}


# ---------------------------------------------------------------------------------------------------------------------
# the job's values: its Run (grpo_lab/memory/run.py), read, never defaulted here

UNITS = "transfer_queue.backend.SimpleStorage.num_data_storage_units"


def with_ray_init(verl: dict[str, Any] | None, log: Log) -> dict[str, Any]:
    """The job's verl config with what verl passed to ray.init (its `ray init kwargs` line) merged in."""
    i = log.first(re.compile(r"^ray init kwargs: \{"))
    try:
        line = ast.literal_eval(log.clean[i][len("ray init kwargs: "):].strip()) if i is not None else None
    except (ValueError, SyntaxError):
        line = None
    if not line or not isinstance(line, dict):
        return dict(verl or {})
    return _merged(verl or {}, {"ray_kwargs": {"ray_init": line}})


def _merged(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    return {**a, **{k: _merged(a[k], v) if isinstance(v, Mapping) and isinstance(a.get(k), Mapping) else v
                    for k, v in b.items()}}


def now(v: Any) -> str:
    """A value of the job's config as the doctor quotes it, or that it is unknown."""
    return "unknown: not in the job's config" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def cpus_needed(run: Run) -> int | None:
    """Ray CPUs the job's placement groups need on a node (grpo_lab.facts), None where its config does not say."""
    gpus, v1, units = run.cfg.trainer.n_gpus_per_node, run.cfg.trainer.use_v1, storage_units(run)
    if gpus is None or v1 is None or (v1 and units is None):
        return None
    return facts.ray_cpus_needed(int(gpus), bool(v1), int(units or 0))


def storage_units(run: Run) -> Any:
    return run.cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units


def already_set(run: Run, override: str) -> bool:
    """Whether the job's config already has this override's value (every verl key a short key sets)."""
    from grpo_lab.cli.apply import already_has

    return already_has(run.verl, override)


def env_override(name: str, value: str) -> str:
    """An environment variable for verl's Ray workers as a Hydra override (Ray wants a string: quoted)."""
    return f'++ray_kwargs.ray_init.runtime_env.env_vars.{name}="{value}"'


# ---------------------------------------------------------------------------------------------------------------------
# a job's files


def read_log(path: Path, limit: int = 32 << 20) -> str:
    """A log's text; of a huge one its head (where verl prints its config) and its tail (where it ended)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            if size <= limit:
                return f.read().decode("utf-8", errors="replace")
            head_size = min(4 << 20, limit // 8)
            head = f.read(head_size)
            f.seek(size - (limit - head_size))
            return (head + b"\n" + f.read()).decode("utf-8", errors="replace")
    except OSError:
        return ""


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file, or {} when it is missing or not one (a job folder may be half written)."""
    data = facts.load_json_or(path, {})
    return data if isinstance(data, dict) else {}


def load_yaml(path: Path) -> dict[str, Any] | None:
    """A YAML mapping from a file (a job's verl_config.yaml), or None when it is missing or not one. libyaml's safe
    loader where there is one (facts.load_yaml): the same data, ~7x faster on a job's config files."""
    try:
        data = facts.load_yaml(path)
        return data if isinstance(data, dict) else None
    except Exception:
        return None

