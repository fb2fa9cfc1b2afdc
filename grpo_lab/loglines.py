"""The one log vocabulary: a log line cleaned, the lines every reader knows, whether a text is a verl or grpo-lab log
(`marker`); the doctor and the dead-engine watcher (launch/fatal.py) read logs through it: docs/after_run.md."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Ray's forwarded-output prefix, nested for vLLM's processes: "(vLLMHttpServer pid=8211) (Worker pid=8548) "
RAY_PREFIX = re.compile(r"^(?:\((?:[\w.\-]+ )?pid=\d+(?:, ip=[\d.]+)?\) ?)+")
# vLLM's logger ("ERROR 12-03 16:45:35 [multiproc_executor.py:1000] "), SGLang's ("[2026-02-27 15:27:13] "), torch's
VLLM_PREFIX = re.compile(r"^(?:ERROR|WARNING|INFO|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[([\w.:\-]+)\] ")
SGLANG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [^\]]*)?\] ")
RANK_PREFIX = re.compile(r"^\[rank\d+\]:")
# a recorder's elapsed seconds ("   16.10 ", the GPU test machine's), and only before Ray's prefix
ELAPSED = re.compile(r"^\s*\d+(?:\.\d+)? ")
ELAPSED_BEFORE_RAY = re.compile(r"^\s*\d+\.\d+ (?=\()")

EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?(?:[A-Z]\w*(?:Error|Exception|Exit)|StopIteration|StopAsyncIteration|"
                            r"KeyboardInterrupt)(?:\(\w+\))?(?::|$)")
FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')

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


def split(text: str, *, elapsed: bool = False) -> list[str]:
    """The text's lines without colour codes; elapsed=True: also without a recorder's elapsed seconds."""
    lines = ANSI.sub("", text).replace("\r\n", "\n").split("\n")
    return [ELAPSED.sub("", line) for line in lines] if elapsed else lines


def without_prefixes(line: str) -> str:
    """A raw line without colour codes and Ray's forwarded-output prefix."""
    return RAY_PREFIX.sub("", ANSI.sub("", line))


def strip(line: str) -> tuple[str, str]:
    """(the line without colour codes, Ray's prefixes and a logger's prefix, the vLLM logger's source file or "")."""
    s = RAY_PREFIX.sub("", ELAPSED_BEFORE_RAY.sub("", ANSI.sub("", line).rstrip("\r\n")))
    m = VLLM_PREFIX.match(s)
    if m:
        return s[m.end():], m.group(1).split(":")[0]
    return SGLANG_PREFIX.sub("", s), ""


def marker(text: str) -> str | None:
    """The first kind of verl / Ray / grpo-lab line found in the text, or None when it has none."""
    lines = split(text, elapsed=True)
    for pattern, what in MARKERS:
        if any(pattern.search(line) for line in lines):
            return what
    return None


def first_line(text: str) -> str:
    line = next((ln.strip() for ln in split(text, elapsed=True) if ln.strip()), "")
    return line if len(line) <= 120 else line[:117] + "..."


def described() -> str:
    """The markers in words, for the doctor's message."""
    return "; ".join(what for _, what in MARKERS)
