"""make lint (issue 29 item 5): ruff with pyproject.toml's settings is clean on the repository, and those settings
catch what they promise (a line over 120 characters, a name never defined)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).parent / "ruff"


def test_make_lint_is_clean():
    proc = subprocess.run(["make", "-C", str(ROOT), "lint"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_settings_catch_a_planted_fault(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(f"X = {'1' * 117}\n" + "Y = undefined_name\n")  # 121 characters; F821
    proc = subprocess.run([str(RUFF), "check", "--config", str(ROOT / "pyproject.toml"), "--output-format", "concise",
                           str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "E501" in proc.stdout and "F821" in proc.stdout, proc.stdout
    bad.write_text(f"X = {'1' * 116}\n")  # 120 characters: allowed
    assert subprocess.run([str(RUFF), "check", "--config", str(ROOT / "pyproject.toml"), str(bad)],
                          capture_output=True, timeout=60).returncode == 0
