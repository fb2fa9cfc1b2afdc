"""Read verl's `file` logger output (metrics.jsonl) into a pandas DataFrame indexed by step (docs/after_run.md)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported where used: the Hydra callback loads this module before every job
    import pandas as pd

METRICS_FILE = "metrics.jsonl"

# the name verl 0.9.1 writes first, then older spellings (a metric not listed has one name: column())
ALIASES: dict[str, tuple[str, ...]] = {f"timing_s/{t}": (f"timing_s/{t}", f"timing/{t}") for t in
                                       ("gen", "update_actor", "step", "old_log_prob", "ref", "update_weights")}
ALIASES["timing_s/step"] += ("perf/time_per_step",)


@dataclass
class MetricsReadResult:
    """How reading went: lines skipped (bad JSON), and whether the last line was partial."""

    skipped: int = 0
    partial_last_line: bool = False


def read_metrics(run: str | Path, info: MetricsReadResult | None = None) -> pd.DataFrame:
    """The job's metrics, one row per step (index `step`, sorted), one column per metric; empty when absent. `run`: a
    job dir (its metrics.jsonl) or the file itself."""
    import pandas as pd

    path = Path(run) / METRICS_FILE if Path(run).is_dir() else Path(run)
    info = info if info is not None else MetricsReadResult()
    rows: dict[int, dict[str, float]] = {}
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    except OSError:
        lines = []
    # a file that does not end in a newline was cut mid-write (running job) unless the last line parses
    for i, line in enumerate(lines):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            if i == len(lines) - 1:
                info.partial_last_line = True
            else:
                info.skipped += 1
            continue
        step, data = _step_and_data(obj)
        if step is None:
            info.skipped += 1
            continue
        rows.setdefault(step, {}).update({k: num for k, v in data.items() if (num := _number(v)) is not None})
    df = pd.DataFrame.from_dict(rows, orient="index")  # no rows: an empty frame
    df.index.name = "step"
    return df.sort_index()


def _step_and_data(obj: object) -> tuple[int | None, dict]:
    if not isinstance(obj, dict):
        return None, {}
    data = obj.get("data")
    if isinstance(data, dict):
        step = obj.get("step", data.get("training/global_step"))
    else:  # a flat {"step": N, metric: value} line (other loggers)
        data = {k: v for k, v in obj.items() if k != "step"}
        step = obj.get("step")
    try:
        return int(step), data
    except (TypeError, ValueError):
        return None, {}


def _number(v: object) -> float | None:
    if isinstance(v, (int, float)):  # a bool too: 1.0 / 0.0
        f = float(v)
        return f if not math.isinf(f) else None
    if isinstance(v, list) and len(v) == 1:
        return _number(v[0])
    return None


def column(df: pd.DataFrame, name: str) -> str | None:
    """The column for a metric, under its current or older name (see ALIASES); None when the run has none."""
    return next((c for c in ALIASES.get(name, (name,)) if c in df.columns and df[c].notna().any()), None)


def series(df: pd.DataFrame, name: str) -> pd.Series:
    """The metric's values by step, NaNs dropped (empty Series when absent)."""
    col = column(df, name)
    if col is None:
        import pandas as pd

        return pd.Series(dtype=float, name=name)
    return df[col].dropna()


def primary_val_column(df: pd.DataFrame) -> str | None:
    """The validation metric to follow: accuracy mean@N, else reward mean@N, else the first validation column
    (`val-core/...` of current verl, else `val/test_score/...` of older ones)."""
    cols = next(([c for c in df.columns if str(c).startswith(p)] for p in ("val-core/", "val/test_score/")
                 if any(str(c).startswith(p) for c in df.columns)), [])
    cols = [c for c in cols if df[c].notna().any()]
    if not cols:
        return None
    for needle in ("/acc/mean@", "/reward/mean@", "/mean@"):
        hits = [c for c in cols if needle in c]
        if hits:
            return sorted(hits, key=_at_n)[-1]  # the largest N
    return cols[0]


def _at_n(name: str) -> int:
    try:
        return int(name.rsplit("@", 1)[1].split("/")[0])
    except (IndexError, ValueError):
        return 0


def training_steps(df: pd.DataFrame) -> pd.Index:
    """Steps that trained (have a reward or a step time); step 0 of val_before_train is validation only."""
    keys = [c for c in (column(df, "critic/score/mean"), column(df, "timing_s/step")) if c]
    if not keys:
        return df.index[df.index > 0]
    return df.index[df[keys].notna().any(axis=1)]


def train_series(df: pd.DataFrame, name: str) -> pd.Series:
    """The metric's values at the steps that trained (training_steps)."""
    s = series(df, name)
    return s[s.index.isin(training_steps(df))] if not s.empty else s


# verl's timers of the work inside a step (the trainer's marked_timer names)
STEP_TIMERS = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
               "update_weights", "save_checkpoint")


def step_less_validation(d: dict[str, Any]) -> float:
    """timing_s/step of one step without its validation, where the step's timer holds it. verl 0.9.1's V1 trainer
    times validation (timing_s/testing) after the step's timer: there step = its phases (every recorded step with
    both, benchmarks/gpu/results/); a trainer that validates inside it shows a step longer than its phases by it."""
    step, test = float(d["timing_s/step"]), float(d.get("timing_s/testing") or 0.0)
    phases = sum(float(d.get(f"timing_s/{t}") or 0.0) for t in STEP_TIMERS)
    return step - test if test and step >= phases + 0.5 * test else step


def steps_less_validation(df: pd.DataFrame) -> pd.Series:
    """step_less_validation at each step that trained."""
    import pandas as pd

    step = train_series(df, "timing_s/step").dropna()
    names = ("timing_s/step", "timing_s/testing", *(f"timing_s/{t}" for t in STEP_TIMERS))
    timers = pd.DataFrame({k: train_series(df, k) for k in names}, index=step.index)
    return pd.Series([step_less_validation(r.dropna().to_dict()) for _, r in timers.iterrows()], index=step.index,
                     dtype=float)


def steady_mean(s: pd.Series) -> float | None:
    """Mean over the steps after the first when there are two or more (step 1 carries warm-up and compile time; the
    time plan's calibration calls steps 2+ steady too)."""
    s = s.dropna()
    if s.empty:
        return None
    if len(s) > 1:
        s = s.iloc[1:]
    return float(s.mean())


def last(s: pd.Series) -> float | None:
    s = s.dropna()
    return float(s.iloc[-1]) if not s.empty else None


def finite_float(v: Any) -> float | None:
    """v as a float, or None when it is not a finite number."""
    try:
        f = float(v)
        return f if math.isfinite(f) else None
    except (TypeError, ValueError):
        return None
