"""Is this text a verl or grpo-lab log? The doctor diagnoses only logs it recognises.

    marker(text)        # what marks it as one ("verl's config print", ...), or None
    first_line(text)    # its first non-empty line, for saying what it is instead

Why, and the lines that mark a log: docs/after_run.md.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ELAPSED = re.compile(r"^\s*\d+(?:\.\d+)? ")  # "   16.10 " (the GPU test machine's recorder)

MARKERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^grpo-lab preflight\b"), "run.py's preflight report"),
    (re.compile(r"^grpo-lab(?: watchdog| doctor)?: "), "a grpo-lab launcher line"),
    (re.compile(r"^\[validate_config\] All configuration checks passed"), "verl's config validation"),
    (re.compile(r"^ray init kwargs: \{"), "verl's `ray init kwargs` line"),
    (re.compile(r"^(?:\([\w.\-]+ pid=\d+(?:, ip=[\d.]+)?\) )?\{'actor_rollout_ref'"), "verl's config print"),
    (re.compile(r"(?:^|\s)step:\d+ - [\w/@\-]+:"), "verl's step metrics"),
    (re.compile(r'File "[^"]*/verl/'), "a traceback through verl"),
    (re.compile(r"^\((?:[A-Za-z_][\w.\-]* )?pid=\d+(?:, ip=[\d.]+)?\) "), "a Ray worker's output"),
    (re.compile(r"\bray::\w+|^ray\.exceptions\.\w+|Started a local Ray instance"), "a Ray error or start-up line"),
)


def _lines(text: str) -> list[str]:
    return [_ELAPSED.sub("", line) for line in _ANSI.sub("", text).replace("\r\n", "\n").split("\n")]


def marker(text: str) -> str | None:
    """The first kind of verl / Ray / grpo-lab line found in the text, or None when it has none."""
    lines = _lines(text)
    for pattern, what in MARKERS:
        if any(pattern.search(line) for line in lines):
            return what
    return None


def first_line(text: str) -> str:
    line = next((ln.strip() for ln in _lines(text) if ln.strip()), "")
    return line if len(line) <= 120 else line[:117] + "..."


def described() -> str:
    """The markers in words, for the doctor's message."""
    return "; ".join(what for _, what in MARKERS)
