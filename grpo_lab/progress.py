"""Progress on stderr for work that can take more than 5 s (tqdm): nothing for the first 5 s; then on a terminal a bar
redrawn in place, elsewhere (a pipe, a job's console tee'd into train.log) a whole line at most every 15 s. docs/cli.md.

    for x in progress(items, "make capacity", unit="configs"): ...
    with waiting("reward probe: compute_score still running"): proc.wait()
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from tqdm import tqdm

DELAY_S, LINE_EVERY_S = 5.0, 15.0
LINE = "grpo-lab: {desc}: {n_fmt}/{total_fmt} {unit}, {elapsed_s:.0f} s"
WAIT_LINE = "grpo-lab: {desc}: {elapsed_s:.0f} s"


class _Lines:
    """A stream for tqdm that writes its redraws as whole lines, at most one per LINE_EVERY_S (no carriage returns)."""

    def __init__(self, out) -> None:
        self.out, self.last = out, -LINE_EVERY_S

    def write(self, s: str) -> None:
        s = s.replace("\r", "").strip()
        if s and time.monotonic() - self.last >= LINE_EVERY_S:
            self.out.write(s + "\n")
            self.out.flush()
            self.last = time.monotonic()

    def flush(self) -> None:
        self.out.flush()


def progress(iterable: Iterable | None = None, desc: str = "", unit: str = "it", line: str = LINE) -> tqdm:
    """tqdm over iterable on stderr, shown after DELAY_S: a bar on a terminal, else a `line` every LINE_EVERY_S."""
    tty = sys.stderr.isatty()
    fmt = line if not tty or line == WAIT_LINE else None  # a bar on a terminal, where there is a total to fill
    return tqdm(iterable, desc=desc, unit=unit, delay=DELAY_S, leave=False, disable=False,
                file=sys.stderr if tty else _Lines(sys.stderr), bar_format=fmt)


@contextmanager
def waiting(desc: str) -> Iterator[None]:
    """The seconds spent inside the block, counted by a thread, as progress() shows them."""
    done = threading.Event()
    with progress(desc=desc, unit="s", line=WAIT_LINE) as bar:

        def tick() -> None:  # one more second each second until the block ends
            while not done.wait(1):
                bar.update(1)

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
