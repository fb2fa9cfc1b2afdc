"""A run whose engine died ends: the fatal lines of vLLM, SGLang and Ray, and a watcher that stops verl's job on them
(the doctor reads the same lines: grpo_lab/after_run/doctor/stops.py's engine_died diagnosis).

    watch = FatalWatch(log_path, stop=lambda: ray.kill(runner), doctor=doctor)   # launch.run_verl (run.py's doctor)
    watch.start(); ...; watch.job_done(); watch.stop()
    watch.fired                                                  # None, or what was seen (label, line, diagnosis)

Why verl needs it, what the watcher does, and every fatal line with its source: docs/launch.md.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_lab.launch.logtail import LogTail
from grpo_lab.loglines import strip

GRACE_S = 5.0        # after a fatal line, verl's own error may still end the job: wait this long before stopping it
INTERVAL_S = 1.0     # how often the log is read
KILL_WAIT_S = 10.0   # after the TaskRunner is killed, how long verl's driver may take to return before SIGINT
ENDS_WITHIN_S = 30.0  # the job ends at most this long after a fatal line (the waits above, then Ray's shutdown)


class EngineDied(RuntimeError):
    """verl's job was stopped because its engine or an actor died (the message says which, and the doctor's view)."""


@dataclass
class Fired:
    label: str
    line: str
    line_no: int
    seen_at: float
    message: str = ""


class TrackedRunner:
    """verl's TaskRunner actor class as run_ppo uses it (`.remote()`, `.options(...).remote()`), remembering the
    actor it creates, so that the watcher can kill it."""

    def __init__(self, cls: Any, owner: TrackedRunner | None = None) -> None:
        self.cls, self.owner = cls, owner or self
        self.handle: Any = None

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self.owner.handle = self.cls.remote(*args, **kwargs)
        return self.owner.handle

    def options(self, **kwargs: Any) -> TrackedRunner:
        return TrackedRunner(self.cls.options(**kwargs), self.owner)

    def kill(self) -> None:
        """Kill the TaskRunner (the actors it created die with it, their owner); without one yet, a RuntimeError."""
        import ray

        if self.owner.handle is None:
            raise RuntimeError("verl has not created its TaskRunner yet")
        ray.kill(self.owner.handle, no_restart=True)


class FatalWatch:
    """Reads a growing log once a second; on a fatal line, waits GRACE_S for the job to end by itself, then calls
    `stop` (kill verl's TaskRunner) and, if the job still runs KILL_WAIT_S later, interrupts the thread that runs it
    (SIGINT, when that is the main thread). `fired` says what was seen; `job_done()` ends the waiting early."""

    def __init__(self, log_path: str | Path, stop: Callable[[], None], *, grace_s: float = GRACE_S,
                 interval_s: float = INTERVAL_S, kill_wait_s: float = KILL_WAIT_S,
                 out: Callable[[str], None] | None = None,
                 doctor: Any) -> None:
        self.log_path = Path(log_path)
        self.stop_job = stop
        self.doctor = doctor  # fatal_line(line), and errors_in(log) for the message: handed down by run.py
        self.grace_s, self.interval_s, self.kill_wait_s = grace_s, interval_s, kill_wait_s
        self.out = out or (lambda s: print(s, file=sys.stderr, flush=True))
        self.fired: Fired | None = None
        self._done = threading.Event()
        self._quit = threading.Event()
        self._thread: threading.Thread | None = None
        self._tail = LogTail(self.log_path)
        self._lines = 0

    def start(self) -> FatalWatch:
        self._tail.from_end()
        with contextlib.suppress(OSError), self.log_path.open("rb") as f:  # unreadable: 0 lines so far
            self._lines = f.read(self._tail.offset).count(b"\n")
        self._job_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._run, name="grpo-lab-fatal-watch", daemon=True)
        self._thread.start()
        return self

    def job_done(self) -> None:
        self._done.set()

    def stop(self) -> None:
        self._done.set()
        self._quit.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def check(self) -> Fired | None:
        """Read what the log gained; the first fatal line in it, if any (the thread calls this every interval)."""
        lines = self._tail.new_lines()
        for k, line in enumerate(lines):
            hit = self.doctor.fatal_line(line)
            if hit:
                return Fired(hit[1], strip(line)[0].strip()[:300], self._lines + k + 1, time.time())
        self._lines += len(lines)
        return None

    def _run(self) -> None:
        while not self._quit.wait(self.interval_s):
            try:
                fired = self.check()
            except Exception:  # a watcher must never take the job down
                continue
            if fired is None:
                continue
            self.fired = fired
            self.out(f"grpo-lab: {fired.label} (train.log line {fired.line_no}: {fired.line}); verl does not recover "
                     f"from this and would wait for ever: the job is stopped in {self.grace_s:g} s unless it ends "
                     f"first")
            if self._done.wait(self.grace_s):
                return  # verl failed (or finished) by itself
            fired.message = self._diagnosis(fired)
            self.out(f"grpo-lab: stopping the job: {fired.message}")
            try:
                self.stop_job()
                self._done.wait(self.kill_wait_s)  # killed: verl's driver returns, or is interrupted below
            except Exception as e:  # noqa: BLE001 (no TaskRunner yet, or Ray already gone)
                self.out(f"grpo-lab: could not kill verl's TaskRunner ({type(e).__name__}: {e}); interrupting it")
            if not self._done.is_set() and self._job_thread == threading.main_thread().ident:
                signal.pthread_kill(self._job_thread, signal.SIGINT)  # Ctrl+C: ray.get gives up, run_verl cleans up
            return

    def _diagnosis(self, fired: Fired) -> str:
        """What grpo-lab tells about the stop: the fatal line and the doctor's first finding on the log so far."""
        ds = self.doctor.errors_in(self.log_path)
        head = (f"{fired.label} at train.log line {fired.line_no} ({fired.line}); verl had not stopped on it "
                f"{time.time() - fired.seen_at:.0f} s later, so grpo-lab stopped the job")
        if not ds:
            return head
        d = ds[0]
        return head + f". doctor: [{d.id}] {d.title}" + (f"; try: {' '.join(d.overrides)}" if d.overrides else "")

