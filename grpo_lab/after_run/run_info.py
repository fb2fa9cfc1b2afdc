"""What a job dir holds, read once for the report's checks (`load_run` -> `RunInfo`): metrics.jsonl, the verl config
it ran with (verl_config.yaml, else the one printed in train.log), Hydra's config, status.json, plan.json, train.log."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from grpo_lab import facts
from grpo_lab.after_run import doctor
from grpo_lab.after_run import metrics as M
from grpo_lab.after_run.doctor.logread import load_yaml
from grpo_lab.labconf import Lab
from grpo_lab.memory.run import Run
from grpo_lab.memory.verl_view import VerlView
from grpo_lab.verl_keys import get as _get


@dataclass
class RunInfo:
    """What a job dir holds besides the metrics."""

    run_dir: Path
    df: pd.DataFrame
    verl: dict[str, Any] = field(default_factory=dict)  # verl_config.yaml, else the config printed in train.log
    hydra: dict[str, Any] = field(default_factory=dict)  # .hydra/config.yaml
    status: dict[str, Any] = field(default_factory=dict)  # status.json
    plan: dict[str, Any] = field(default_factory=dict)  # plan.json
    log_text: str = ""
    partial_last_line: bool = False

    @property
    def overrides(self) -> list[str] | None:
        """The command line's overrides as Hydra kept them (.hydra/overrides.yaml), or None without that file."""
        got = facts.load_yaml_or(self.run_dir / ".hydra" / "overrides.yaml", None)
        return [str(o) for o in got] if isinstance(got, list) else None

    @property
    def lab(self) -> Lab:
        return Lab.of(self.hydra.get("lab"))

    @functools.cached_property
    def job(self) -> Run:
        """The job's Run, as planned: an emulated card's run in the user's terms (docs/after_run.md)."""
        from grpo_lab.after_run.doctor.verdict import job_run

        return job_run(self.verl, self.lab, self.plan)

    @property
    def cfg(self) -> VerlView:
        """The verl config the job ran with, typed (its Run's: a key it does not give is None)."""
        return self.job.cfg

    @property
    def max_response_length(self) -> int | None:
        v = self.cfg.data.max_response_length
        return int_or_none(self.hydra.get("max_response_length") if v is None else v)

    @property
    def gpu_memory_gb(self) -> float | None:
        v = M.finite_float(self.lab.hardware.gpu_memory_gb) or M.finite_float(
            _get(self.plan, "memory.card_gb"))  # the plan's card where the job folder kept no .hydra/
        if v:
            return v
        # verl's worker prints "device memory used/total (GB): 0.51/139.80"
        m = re.search(r"device memory used/total \(GB\): [\d.]+/([\d.]+)", self.log_text)
        return float(m.group(1)) if m else None

    @property
    def model_name(self) -> str | None:
        name = self.lab.model.name or self.cfg.model.path
        return str(name) if name else None

    @property
    def thinking(self) -> bool | None:
        v = self.lab.model.thinking
        if isinstance(v, bool):
            return v
        return False if "base" in (self.model_name or "").lower() else None


def int_or_none(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def load_run(run_dir: str | Path) -> RunInfo:
    run_dir = Path(run_dir)
    info = M.MetricsReadResult()
    df = M.read_metrics(run_dir, info)
    log_text = doctor.read_log(run_dir / "train.log")
    verl = load_yaml(run_dir / "verl_config.yaml") or {}
    if not verl and log_text:
        verl = doctor.printed_config(doctor.Log.of(log_text[: 8 << 20]))
    return RunInfo(run_dir=run_dir, df=df, verl=verl, hydra=load_yaml(run_dir / ".hydra" / "config.yaml") or {},
                   status=doctor.read_json(run_dir / "status.json"), plan=doctor.read_json(run_dir / "plan.json"),
                   log_text=log_text, partial_last_line=info.partial_last_line)
