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

    def line(ax: Any, name: str) -> bool:
        s = M.series(df, name)
        if s.empty:
            return False
        ax.plot(s.index, s.values, marker="o", markersize=3, label=M.column(df, name))
        return True

    panels = {"reward (critic/score/mean) and validation": ["critic/score/mean"],
              "response length (tokens)": ["response_length/mean", "response_length/max"],
              "actor/entropy": ["actor/entropy"],
              "actor/pg_clipfrac, actor/ppo_kl": ["actor/pg_clipfrac", "actor/ppo_kl"],
              "phase times (s)": ["timing_s/gen", "timing_s/update_actor", "timing_s/step", "timing_s/old_log_prob",
                                  "timing_s/ref"],
              "perf/throughput (tokens/s per GPU)": ["perf/throughput"],
              "training-phase GPU memory (GB)": ["actor/perf/max_memory_allocated_gb",
                                                 "actor/perf/max_memory_reserved_gb"],
              "rollout vs training precision / grad norm": []}
    for ax, (title, names) in zip(axes, panels.items()):
        for name in names:
            line(ax, name)
        ax.set_title(title)

    lo, hi = M.series(df, "critic/score/min"), M.series(df, "critic/score/max")
    if not lo.empty and not hi.empty:
        axes[0].fill_between(lo.index, lo.values, hi.reindex(lo.index).values, alpha=0.15, label="min..max")
    val = M.primary_val_column(df)
    if val:
        s = df[val].dropna()
        axes[0].plot(s.index, s.values, marker="s", linestyle="--", label=val)

    if run.max_response_length:
        axes[1].axhline(run.max_response_length, color="red", linestyle=":",
                        label=f"limit {run.max_response_length}")
    ax2 = axes[1].twinx()
    s = M.series(df, "response_length/clip_ratio")
    if not s.empty:
        ax2.plot(s.index, s.values, color="gray", linestyle="--", label="clip_ratio")
        ax2.set_ylim(0, 1.05)
        ax2.set_ylabel("clip_ratio")

    axes[3].axhline(PG_CLIPFRAC_WARN, color="orange", linestyle=":", label="a few percent")
    if run.gpu_memory_gb:
        axes[6].axhline(run.gpu_memory_gb, color="red", linestyle=":", label=f"card {run.gpu_memory_gb:g} GB")
    if not line(axes[7], "training/rollout_probs_diff_mean"):
        line(axes[7], "actor/grad_norm")

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
