"""The watchdog of a running job: `ProgressWatchdog(log_path).start()/.stop()` warns once when the log shows no
progress for N minutes, with what the doctor reads in it so far."""

from __future__ import annotations

import contextlib
import shlex
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from grpo_lab.after_run.doctor.logread import Log, read_log
from grpo_lab.after_run.doctor.stops import NOISE
from grpo_lab.after_run.doctor.verdict import diagnose
from grpo_lab.launch.logtail import LogTail
from grpo_lab.loglines import without_prefixes


def _stall_message(text: str, idle_s: float) -> str:
    steps = Log.of(text[-200_000:]).steps()
    where = f"last step: {max(steps)}" if steps else "no step finished yet"
    msg = [f"grpo-lab watchdog: no progress for {idle_s / 60:.0f} minutes ({where})."]
    # an error a worker printed before the driver hung, or where the log stopped (CPU budget, NCCL init)
    ds = [d for d in diagnose(text, idle_s=idle_s, stale_minutes=0) if d.id != "stopped_without_error"]
    if ds:
        msg.append(f"  likely: {ds[0].title}")
        if ds[0].overrides:
            msg.append("  try: " + " ".join(shlex.quote(o) for o in ds[0].overrides))
    msg.append("  On GeForce cards a stall in NCCL (no P2P over PCIe) is common: NCCL_P2P_DISABLE=1. A stall right "
               "after the config print is the V1 trainer waiting for Ray CPUs (3 per GPU + 2 + TransferQueue storage "
               "units): ray_kwargs.ray_init.num_cpus / transfer_queue.backend.SimpleStorage.num_data_storage_units.")
    return "\n".join(msg)


class ProgressWatchdog:
    """Warns once when the log shows no progress (a new line other than noise: Ray's autoscaler warnings, its own
    output) for stale_minutes. start() runs a daemon thread, stop() joins it."""

    def __init__(self, log_path: str | Path, stale_minutes: float = 10.0, interval_s: float = 30.0,
                 out: Callable[[str], None] | None = None) -> None:
        self.log_path = Path(log_path)
        self.stale_s = stale_minutes * 60
        self.interval_s = interval_s
        self.out = out or (lambda s: print(s, file=sys.stderr, flush=True))
        self.warned = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tail = LogTail(self.log_path)
        self._last_progress = time.time()

    def start(self) -> ProgressWatchdog:
        self._last_progress = time.time()
        self._tail.from_end()
        self._thread = threading.Thread(target=self._run, name="grpo-lab-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, self.interval_s + 1))
            self._thread = None

    def check(self, now: float | None = None) -> str | None:
        """One poll (the thread calls this every interval_s): reads what the log gained, warns once when stale."""
        now = time.time() if now is None else now
        if any(not NOISE.search(without_prefixes(ln)) for ln in self._tail.new_lines()):
            self._last_progress = now
        idle = now - self._last_progress
        if self.warned or idle < self.stale_s:
            return None
        self.warned = True
        message = _stall_message(read_log(self.log_path), idle)
        with contextlib.suppress(Exception):
            self.out(message)
        return message

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):
                self.check()
            if self.warned:
                return

