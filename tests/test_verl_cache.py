"""The cache of verl's composed ppo_trainer: written once, read back, rebuilt when verl changes, never required."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import CONF, ROOT
from grpo_lab.verl_schema import verl_cache
from grpo_lab.verl_schema.verl_paths import verl_config_dir

VERL = verl_config_dir()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of its own, and no composed config left in this process."""
    monkeypatch.setenv(verl_cache.DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(verl_cache, "_memo", {})
    return tmp_path / "cache"


def _files(cache: Path) -> list[Path]:
    return sorted(cache.glob("verl-ppo_trainer-*.yaml")) if cache.is_dir() else []


def _plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=False)


def _verl_copy(tmp_path: Path) -> str:
    dst = tmp_path / "verl_config"
    shutil.copytree(VERL, dst, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return str(dst)


def test_written_once_then_read_back(cache, monkeypatch):
    first = verl_cache.composed_ppo_trainer(VERL)
    assert first is not None and "defaults" not in first
    assert first.actor_rollout_ref.actor.strategy == "fsdp"  # verl's dp_actor, through its defaults list
    (path,) = _files(cache)
    assert yaml.safe_load(path.read_text())["key"] == verl_cache.cache_key(VERL)
    # a new process: nothing in memory, and composing verl's files is not needed
    monkeypatch.setattr(verl_cache, "_memo", {})
    monkeypatch.setattr(verl_cache, "_build", lambda d: pytest.fail("rebuilt although the file was there"))
    again = verl_cache.composed_ppo_trainer(VERL)
    assert _plain(again) == _plain(first)
    assert again is not verl_cache.composed_ppo_trainer(VERL)  # each compose its own copy (Hydra moves its nodes)


def test_rebuilt_when_a_verl_file_changes(cache, tmp_path):
    verl = _verl_copy(tmp_path)
    before = verl_cache.composed_ppo_trainer(verl)
    assert "grpo_lab_marker" not in before.data
    leaf = Path(verl) / "data" / "legacy_data.yaml"
    leaf.write_text(leaf.read_text() + "\ngrpo_lab_marker: 7\n")
    st = leaf.stat()
    os.utime(leaf, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    after = verl_cache.composed_ppo_trainer(verl)
    assert after.data.grpo_lab_marker == 7
    assert len(_files(cache)) == 2


def test_unwritable_cache_dir_still_serves_the_same_config(tmp_path, monkeypatch):
    monkeypatch.setattr(verl_cache, "_memo", {})
    monkeypatch.setenv(verl_cache.DIR_ENV, str(tmp_path / "cache"))
    written = _plain(verl_cache.composed_ppo_trainer(VERL))
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    monkeypatch.setenv(verl_cache.DIR_ENV, str(blocker / "cache"))  # mkdir fails, for root too
    monkeypatch.setattr(verl_cache, "_memo", {})
    cfg = verl_cache.composed_ppo_trainer(VERL)
    assert cfg is not None and _plain(cfg) == written
    assert list(tmp_path.glob("**/*.tmp")) == []


def test_a_broken_cache_file_is_rebuilt(cache):
    good = _plain(verl_cache.composed_ppo_trainer(VERL))
    (path,) = _files(cache)
    path.write_text("key: [unclosed\n")
    verl_cache._memo.clear()
    assert _plain(verl_cache.composed_ppo_trainer(VERL)) == good
    assert yaml.safe_load(path.read_text())["key"] == verl_cache.cache_key(VERL)


def test_a_verl_file_that_sets_hydras_node_gets_no_cache(cache, tmp_path):
    verl = _verl_copy(tmp_path)
    leaf = Path(verl) / "legacy_reward_impl.yaml"
    leaf.write_text(leaf.read_text() + "\nhydra:\n  job:\n    chdir: true\n")
    assert verl_cache.composed_ppo_trainer(verl) is None  # the source then reads verl's own files
    assert _files(cache) == []


def test_off_switch(monkeypatch):
    for value, on in [("0", False), ("off", False), ("false", False), ("1", True), ("", True)]:
        monkeypatch.setenv(verl_cache.ENV, value)
        assert verl_cache.enabled() is on, value
    monkeypatch.delenv(verl_cache.ENV)
    assert verl_cache.enabled()


def test_building_the_cache_never_imports_verl(tmp_path):
    code = (
        "import sys\n"
        "from hydra import compose, initialize_config_dir\n"
        f"with initialize_config_dir(config_dir={str(CONF)!r}, version_base=None):\n"
        "    cfg = compose('config', overrides=['experiment=smoke_tiny'])\n"
        "assert cfg.actor_rollout_ref.actor.strategy == 'fsdp'\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'verl', 'torch', 'ray', 'pandas', 'numpy'}))\n")
    env = {**os.environ, verl_cache.DIR_ENV: str(tmp_path / "cache")}
    env.pop(verl_cache.ENV, None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
    assert len(_files(tmp_path / "cache")) == 1


@pytest.mark.parametrize("args,needed", [
    (["ppo_mini_batch_size=7", "experiment=smoke_tiny"], None),
    (["model=qwen3_4b", "rollout=tp2_mem06", "~model"], None),  # our groups of the same names as verl's
    (["-m", "rollout_gpu_mem_util=0.3,0.4", "actor_rollout_ref.actor.optim.lr=1e-6", "data.train_batch_size=8"],
     None),
    (["--cfg", "job", "--resolve", "hydra/job_logging=disabled", "+trainer.x=1"], None),
    (["-cn", "config", "hydra.run.dir=outputs/x"], None),
    (["model_engine=megatron"], "model_engine=megatron"),
    (["-m", "model_engine=dp,veomni"], "model_engine=dp,veomni"),
    (["actor@actor_rollout_ref.actor=veomni_actor"], "actor@actor_rollout_ref.actor=veomni_actor"),
    (["model@actor_rollout_ref.model=hf_model"], "model@actor_rollout_ref.model=hf_model"),
    (["optim@actor_rollout_ref.actor.optim=veomni"], "optim@actor_rollout_ref.actor.optim=veomni"),
    (["+model_engine=veomni"], "+model_engine=veomni"),
    (["~model_engine"], "~model_engine"),
    (["--info", "defaults"], "--info"),
    (["--cfg", "hydra"], "--cfg hydra"),
    (["-c", "all"], "-c all"),
    (["--config-dir", "/somewhere"], "--config-dir"),
    (["hydra.searchpath=[file:///x]"], "hydra.searchpath=[file:///x]"),
])
def test_tree_needed(args, needed):
    assert verl_cache.tree_needed(args, CONF) == needed


def test_tree_if_needed_turns_the_cache_off_inside_only(monkeypatch):
    monkeypatch.delenv(verl_cache.ENV, raising=False)
    with verl_cache.tree_if_needed(["model_engine=veomni"], CONF) as arg:
        assert arg == "model_engine=veomni" and not verl_cache.enabled()
    assert verl_cache.ENV not in os.environ
    with verl_cache.tree_if_needed(["ppo_mini_batch_size=8"], CONF) as arg:
        assert arg is None and verl_cache.enabled()


def test_no_config_file_of_ours_picks_a_verl_group_option():
    # the cached ppo_trainer has no defaults list left to override: such a file would need GRPO_LAB_VERL_CACHE=0
    theirs, ours = verl_cache._groups(VERL), verl_cache._groups(CONF)
    for path in sorted(CONF.rglob("*.yaml")):
        for entry in (yaml.safe_load(path.read_text()) or {}).get("defaults", []):
            key = next(iter(entry)) if isinstance(entry, dict) else entry
            group, _, package = key.removeprefix("override ").lstrip("/").partition("@")
            assert not (group in theirs and (package or group not in ours)), f"{path}: {entry}"
