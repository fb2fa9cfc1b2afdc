"""The doctor's reading of a log: its lines without Ray's, vLLM's and torch's prefixes, the config verl printed into
it, the job's own values for the overrides it suggests, and the Diagnosis every finding is."""

from __future__ import annotations

import ast
import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab import facts, loglines
from grpo_lab.verl_keys import get as _get

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
        clean, procs = [], []
        for line in raw:
            m = loglines.RAY_PREFIX.match(line)
            proc = m.group(0) if m else ""
            rest = line[len(proc):]
            rest = loglines.VLLM_PREFIX.sub("", rest)
            rest = loglines.RANK_PREFIX.sub("", rest)
            clean.append(rest)
            procs.append(proc)
        return cls(raw, clean, procs)

    def find(self, pattern: re.Pattern[str], start: int = 0) -> list[int]:
        return [i for i in range(start, len(self.clean)) if pattern.search(self.clean[i])]

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


def ray_init_kwargs(log: Log) -> dict[str, Any]:
    i = log.first(re.compile(r"^ray init kwargs: \{"))
    if i is None:
        return {}
    try:
        d = ast.literal_eval(log.clean[i][len("ray init kwargs: "):].strip())
        return d if isinstance(d, dict) else {}
    except (ValueError, SyntaxError):
        return {}


# ---------------------------------------------------------------------------------------------------------------------
# overrides with values from the job's config


class Values:
    """The job's current values (verl config from verl_config.yaml or the log's config print; else the guide's)."""

    def __init__(self, cfg: dict[str, Any] | None, ray_init: dict[str, Any] | None = None) -> None:
        self.cfg = cfg or {}
        self.ray_init = ray_init or {}

    def num(self, path: str, default: float) -> float:
        v = _get(self.cfg, path)
        try:
            return float(v)
        except (TypeError, ValueError):
            return default

    @property
    def util(self) -> float:
        return self.num("actor_rollout_ref.rollout.gpu_memory_utilization", 0.4)

    @property
    def n(self) -> int:
        return int(self.num("actor_rollout_ref.rollout.n", 5))

    @property
    def max_prompt(self) -> int:
        return int(self.num("data.max_prompt_length", 512))

    @property
    def max_response(self) -> int:
        return int(self.num("data.max_response_length", 1024))

    @property
    def token_len(self) -> int:
        return int(self.num("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 3000))

    @property
    def dynamic_bsz(self) -> bool:
        return bool(_get(self.cfg, "actor_rollout_ref.actor.use_dynamic_bsz", True))

    @property
    def micro(self) -> int:
        return int(self.num("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 2))

    @property
    def gpus(self) -> int:
        return int(self.num("trainer.n_gpus_per_node", 4)) * max(1, int(self.num("trainer.nnodes", 1)))

    @property
    def storage_units(self) -> int:
        return int(self.num("transfer_queue.backend.SimpleStorage.num_data_storage_units", 8))

    @property
    def num_cpus(self) -> int | None:
        v = self.ray_init.get("num_cpus", _get(self.cfg, "ray_kwargs.ray_init.num_cpus"))
        try:
            return int(v)
        except (TypeError, ValueError):
            return None

    @property
    def use_v1(self) -> bool:
        return bool(_get(self.cfg, "trainer.use_v1", True))

    # --- the lowered values to try
    def lower_util(self) -> str | None:
        """vLLM's share 0.1 lower, at least 0.1; None where that is no lower than it is (a fix never raises it)."""
        lower = max(0.1, round(self.util - 0.1, 2))
        return f"rollout_gpu_mem_util={lower:g}" if lower < self.util else None

    def lower_n(self) -> str | None:
        return f"rollout_n={self.n - 1}" if self.n > 2 else None

    def lower_response(self) -> str:
        return f"max_response_length={max(128, (self.max_response * 3 // 4) // 64 * 64)}"

    def lower_token_len(self) -> str | None:
        floor = self.max_prompt + self.max_response  # one whole sequence must fit a micro-batch
        new = max(floor, (self.token_len * 2 // 3) // 256 * 256)
        return f"ppo_max_token_len_per_gpu={new}" if new < self.token_len else None

    def lower_micro(self) -> str:
        return f"ppo_micro_batch_size_per_gpu={max(1, self.micro // 2)}"

    def cpus_needed(self) -> int:
        """Ray CPUs the job's placement groups need (grpo_lab.facts: 3 per GPU + TaskRunner + TQ controller + units)."""
        return facts.ray_cpus_needed(self.gpus, self.use_v1, self.storage_units)


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
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def load_yaml(path: Path) -> dict[str, Any] | None:
    """A YAML mapping from a file (a job's verl_config.yaml), or None when it is missing or not one."""
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
        return data if isinstance(data, dict) else None
    except Exception:
        return None

