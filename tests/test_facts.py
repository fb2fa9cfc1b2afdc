"""grpo_lab/facts.py: the shared facts (Ray's CPU need, atomic writes, conf/'s options as Hydra composes them)."""

from __future__ import annotations

import os
import re
import stat

import pytest
from conftest import CONF, ROOT, compose_cfg
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobRuntime

from grpo_lab import facts
from grpo_lab.verl_schema.hydra_internals import version_base


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


# ---- conf/'s options, composed by Hydra ----------------------------------------------------------------------------

def test_an_option_is_composed_with_its_defaults_list_and_the_options_it_picks():
    base = facts.conf_option("model", "qwen3_4b_base")  # defaults: qwen3_4b, then its own keys
    assert base["lab"]["model"]["name"] == "qwen3_4b_base" and base["lab"]["model"]["hidden_size"] == 2560
    assert facts.conf_option("model", "qwen3_8b_lora")["rollout_tp"] == 2  # override /rollout: tp2_mem04
    assert facts.conf_option("model", "smollm2_135m")["model_path"] == "${hydra:runtime.cwd}/data/smollm2-135m-instruct"
    assert facts.conf_option("model", "no_such_model") == {}
    assert list(facts.conf_options("model")) == sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
    assert facts.conf_groups()[:3] == ("hardware", "rollout", "model")  # conf/config.yaml's order


def test_a_hardware_options_card_is_the_one_its_defaults_list_brings():
    assert facts.hardware_card_gb("ray_cluster") == facts.hardware_card_gb("rtx4080x4") == 32.0  # defaults: rtx4080x4
    assert facts.hardware_card_gb("rtx4080_16gbx4") == 16.0  # over rtx4080x4's 32
    assert facts.hardware_card_gb("h200x1") == 139.8
    assert facts.hardware_card_gb("no_such_hardware") is None


def test_the_model_option_of_a_model_path(monkeypatch):
    assert facts.model_group("Qwen/Qwen3-4B-Base")["name"] == "qwen3_4b_base"
    assert facts.model_group("Qwen/Qwen3-0.6B", "qwen3_1_7b")["name"] == "qwen3_0_6b"  # the chosen one does not match
    # written ${hydra:runtime.cwd}/data/...: the folder run.py is launched from
    monkeypatch.chdir(ROOT)
    assert facts.model_group(str(ROOT / "data" / "smollm2-135m-instruct"))["name"] == "smollm2_135m"
    assert facts.model_group("/elsewhere/data/smollm2-135m-instruct") is None
    assert facts.model_group("someone/Unknown-7B") is None
    assert facts.model_group_of_folder("smollm2-135m-instruct")["name"] == "smollm2_135m"
    assert facts.model_group_of_folder("Qwen3-8B")["name"] == "qwen3_8b_lora"
    assert facts.model_group_of_folder("no-such-folder") is None


def test_each_preset_learning_rate_is_what_its_option_runs_with():
    presets = facts.preset_learning_rates()
    assert presets == tuple(sorted(presets)) and (1e-6, "conf/config.yaml") in presets
    for lr, name in presets:
        group_option = [] if name == "conf/config.yaml" else ["=".join(name[len("conf/"):-len(".yaml")].split("/"))]
        assert compose_cfg(*group_option).actor_rollout_ref.actor.optim.lr == lr, name
    # every actor_lr a file under conf/ writes is one of them (a file whose defaults list brings one is one too)
    written = {(float(m.group(1)), str(f.relative_to(ROOT))) for f in CONF.rglob("*.yaml")
               for m in re.finditer(r"^actor_lr: *([0-9.e+-]+)", f.read_text(), re.M)}
    assert written and written <= set(presets)


def test_composing_an_option_puts_back_the_hydra_that_was_set_up():
    compose_cfg()  # the tests' own Hydra, as run.py's app has one
    before = (GlobalHydra.instance().hydra, JobRuntime.instance().get("name"), version_base())
    assert facts.conf_options("model", [f"not_composed_before_{os.getpid()}"]) == {}
    assert (GlobalHydra.instance().hydra, JobRuntime.instance().get("name"), version_base()) == before
    assert compose_cfg("model=qwen3_0_6b").lab.model.name == "qwen3_0_6b"
