"""A sweep's exit code: a job grpo-lab refused makes it 2, a plan that holds but cannot start here makes it 3.

A refused sweep job is no crash: its task returns "refused" and the sweep goes on to the next point
(grpo_lab/launch/job.py). What the sweep as a whole did is read at its end by a Hydra callback, from the record every
job leaves whichever launcher ran it (one after another in this process, side by side in worker processes, as SLURM
tasks): its status.json. Registered in conf/config.yaml:

    hydra:
      callbacks:
        sweep_outcome:
          _target_: grpo_lab.launch.outcome.SweepOutcomeCallback

Hydra calls the callbacks' on_multirun_end last-listed first; this one is listed first, so that it ends the process
after the others (the sweep summary) are done. A single run sets its exit code itself (launch_job raises SystemExit).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from grpo_lab import facts

REFUSED_EXIT = 2  # a config grpo-lab refused: nothing was started (docs/launch.md: exit codes)
NOT_READY_EXIT = 3  # a plan (preflight.only) that holds, but cannot start on this machine


@dataclass
class SweepOutcome:
    refused: list[str] = field(default_factory=list)  # the refused jobs' folders
    not_ready: list[str] = field(default_factory=list)  # the folders of plans that hold but cannot start here

    @property
    def exit_code(self) -> int:
        """2 when any job was refused, else 3 when any plan is not ready here, else 0."""
        return REFUSED_EXIT if self.refused else NOT_READY_EXIT if self.not_ready else 0

    def message(self) -> str:
        """The line run.py's user reads after the sweep; "" when every job passed."""
        if self.refused:
            return (f"grpo-lab: {len(self.refused)} sweep job(s) refused: {', '.join(self.refused)} (their plan.json "
                    f"and the sweep's summary.md say why)")
        if self.not_ready:
            return (f"grpo-lab: {len(self.not_ready)} sweep job(s) planned OK but not ready to launch here (each "
                    f"job's line above; plan.json \"not_ready_here\")")
        return ""


def _in_order(path: Path) -> list[Any]:
    """job2 before job10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.parent.name)]


def sweep_outcome(sweep_dir: str | os.PathLike) -> SweepOutcome:
    """The refused and not-ready jobs of a sweep folder, from each job's status.json (grpo_lab/launch/job.py's
    JobStatus: refused = failed with exit 2; not ready = ok with ready_here false), in job order."""
    out = SweepOutcome()
    for status in sorted(Path(sweep_dir).glob("*/status.json"), key=_in_order):
        st = facts.load_json_or(status, None)
        if not isinstance(st, dict):
            continue  # a job that wrote no readable status: Hydra or the summary report it
        job = os.path.abspath(status.parent)
        if st.get("status") == "failed" and st.get("exit") == REFUSED_EXIT:
            out.refused.append(job)
        elif st.get("status") == "ok" and st.get("ready_here") is False:
            out.not_ready.append(job)
    return out


class SweepOutcomeCallback(Callback):
    """At the end of a multirun: the refused / not-ready jobs named on stderr, and the process's exit code."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        outcome = sweep_outcome(str(config.hydra.sweep.dir))
        if outcome.exit_code:
            print(outcome.message(), file=sys.stderr)
            raise SystemExit(outcome.exit_code)
