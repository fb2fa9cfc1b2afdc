"""grpo_lab/facts.py: the shared facts (Ray's CPU need, atomic writes)."""

from __future__ import annotations

import os
import stat

import pytest

from grpo_lab import facts


def test_atomic_write_gives_the_mode_a_plain_open_gives(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    written = facts.atomic_write(tmp_path / "sub" / "plan.json", "{}\n")
    assert written.read_text() == "{}\n"
    assert stat.S_IMODE(written.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)  # not mkstemp's 0600


def test_atomic_write_leaves_the_old_file_and_no_temp_when_it_fails(tmp_path):
    target = tmp_path / "status.json"
    facts.atomic_write(target, "old")

    class Boom:  # not str or bytes: the write fails half-way
        pass

    with pytest.raises(TypeError):
        facts.atomic_write(target, Boom())  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["status.json"]


def test_ray_cpus_of_the_v1_trainer():
    # 3 per GPU + TaskRunner + TransferQueue controller + storage units (seen on the H200: 8 hung, 16 ran)
    assert facts.ray_cpus_needed(1, True, 8) == 13
    assert facts.ray_cpus_needed(4, True, 2) == 16
    assert facts.ray_cpus_needed(4, False, 8) < facts.ray_cpus_needed(4, True, 8)
