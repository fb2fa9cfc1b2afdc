"""report.png: the curves the report's checks read (grpo_lab/after_run/report_checks.py), one panel each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_lab.after_run import metrics as M
from grpo_lab.after_run.report_checks import PG_CLIPFRAC_WARN
from grpo_lab.after_run.run_info import RunInfo


def plot_run(run: RunInfo, path: Path) -> Path | None:
    """report.png: the curves the checks read, one panel each."""
    df = run.df
    if df.empty:
        return None
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, safe in threads

    fig = Figure(figsize=(13, 13), dpi=80)
    axes = fig.subplots(4, 2).ravel()

    def line(ax: Any, name: str, label: str | None = None, **kw: Any) -> bool:
        s = M.series(df, name)
        if s.empty:
            return False
        ax.plot(s.index, s.values, marker="o", markersize=3, label=label or M.column(df, name), **kw)
        return True

    ax = axes[0]
    line(ax, "critic/score/mean")
    lo, hi = M.series(df, "critic/score/min"), M.series(df, "critic/score/max")
    if not lo.empty and not hi.empty:
        ax.fill_between(lo.index, lo.values, hi.reindex(lo.index).values, alpha=0.15, label="min..max")
    val = M.primary_val_column(df)
    if val:
        s = df[val].dropna()
        ax.plot(s.index, s.values, marker="s", linestyle="--", label=val)
    ax.set_title("reward (critic/score/mean) and validation")

    ax = axes[1]
    line(ax, "response_length/mean")
    line(ax, "response_length/max")
    if run.max_response_length:
        ax.axhline(run.max_response_length, color="red", linestyle=":", label=f"limit {run.max_response_length}")
    ax.set_title("response length (tokens)")
    ax2 = ax.twinx()
    s = M.series(df, "response_length/clip_ratio")
    if not s.empty:
        ax2.plot(s.index, s.values, color="gray", linestyle="--", label="clip_ratio")
        ax2.set_ylim(0, 1.05)
        ax2.set_ylabel("clip_ratio")

    ax = axes[2]
    line(ax, "actor/entropy")
    ax.set_title("actor/entropy")

    ax = axes[3]
    line(ax, "actor/pg_clipfrac")
    line(ax, "actor/ppo_kl")
    ax.axhline(PG_CLIPFRAC_WARN, color="orange", linestyle=":", label="a few percent")
    ax.set_title("actor/pg_clipfrac, actor/ppo_kl")

    ax = axes[4]
    for name in ("timing_s/gen", "timing_s/update_actor", "timing_s/step", "timing_s/old_log_prob", "timing_s/ref"):
        line(ax, name)
    ax.set_title("phase times (s)")

    ax = axes[5]
    line(ax, "perf/throughput")
    ax.set_title("perf/throughput (tokens/s per GPU)")

    ax = axes[6]
    line(ax, "actor/perf/max_memory_allocated_gb")
    line(ax, "actor/perf/max_memory_reserved_gb")
    if run.gpu_memory_gb:
        ax.axhline(run.gpu_memory_gb, color="red", linestyle=":", label=f"card {run.gpu_memory_gb:g} GB")
    ax.set_title("training-phase GPU memory (GB)")

    ax = axes[7]
    if not line(ax, "training/rollout_probs_diff_mean"):
        line(ax, "actor/grad_norm")
    ax.set_title("rollout vs training precision / grad norm")

    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"grpo-lab report: {run.run_dir.name}")
    fig.tight_layout()
    fig.savefig(path)
    return path
