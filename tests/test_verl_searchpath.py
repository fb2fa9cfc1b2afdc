"""Hydra reads verl's folder through VerlConfigSource: the composed config is the one verl's own files give."""

from __future__ import annotations

import os

import pytest
import yaml
from conftest import CONF, run_py
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from grpo_lab.launch.prepare import split
from grpo_lab.verl_schema.verl_cache import ENV

# what the cache must not change: the defaults, a preset on other hardware, a variant, a model that picks its rollout
CONFIGS = [(), ("experiment=smoke_tiny", "hardware=h200x1"), ("variant=dapo",), ("model=qwen3_8b_lora",)]
# where the two differ by design: Hydra lists the group choices of the defaults tree it walked, and its sources
HYDRA_RECORDS = ("choices", "config_sources")


def _compose(monkeypatch, cached: bool, overrides) -> tuple[dict, dict, dict]:
    """(config without `hydra`, the `hydra` node, (verl, lab) resolved) with the cache on or off."""
    monkeypatch.setenv(ENV, "1" if cached else "0")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=[*overrides, "train_file=/x/train.parquet", "test_file=/x/test.parquet"],
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    plain = OmegaConf.to_container(cfg, resolve=False)
    hydra = plain.pop("hydra")
    return plain, hydra, split(cfg)


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: " ".join(o) or "defaults")
def test_cached_ppo_trainer_composes_the_identical_config(monkeypatch, overrides):
    tree, tree_hydra, tree_split = _compose(monkeypatch, False, overrides)
    cached, cached_hydra, cached_split = _compose(monkeypatch, True, overrides)
    # the cache was in use (its source on the searchpath, no verl group choices recorded) and verl's tree was not
    assert {s["schema"] for s in cached_hydra["runtime"]["config_sources"]} >= {"grpolab-verl"}
    assert "grpolab-verl" not in {s["schema"] for s in tree_hydra["runtime"]["config_sources"]}
    assert "model_engine" in tree_hydra["runtime"]["choices"]
    assert "model_engine" not in cached_hydra["runtime"]["choices"]
    # key for key, value for value, in the same order (verl_config.yaml and .hydra/config.yaml read the same)
    assert yaml.safe_dump(cached, sort_keys=False) == yaml.safe_dump(tree, sort_keys=False)
    assert cached_split == tree_split
    for record in HYDRA_RECORDS:
        del tree_hydra["runtime"][record], cached_hydra["runtime"][record]
    assert cached_hydra == tree_hydra


def test_with_the_cache_a_verl_group_option_needs_the_tree(monkeypatch):
    # why run.py turns the cache off for such a command line (grpo_lab.cli.overrides.tree_needed)
    monkeypatch.setenv(ENV, "1")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        with pytest.raises(ConfigCompositionException, match="model_engine"):
            compose("config", overrides=["model_engine=veomni"])
    monkeypatch.setenv(ENV, "0")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=["model_engine=veomni"])
    assert cfg.actor_rollout_ref.actor.strategy == "veomni"


def test_help_lists_verl_groups_as_before():
    # Hydra's default page (grpo-lab's own --help lists only conf/'s groups): verl's groups, with the cache or without
    cached = run_py("--help", "hydra/help=default", env={ENV: "1"})
    tree = run_py("--help", "hydra/help=default", env={ENV: "0"})
    assert cached.returncode == tree.returncode == 0, cached.stderr[-2000:]
    assert "model_engine: dp, megatron, torchtitan, veomni" in cached.stdout
    assert cached.stdout == tree.stdout


def test_off_puts_verl_on_the_searchpath_as_files(monkeypatch):
    monkeypatch.setenv(ENV, "0")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", return_hydra_config=True)
    verl = [s for s in cfg.hydra.runtime.config_sources if s.provider == "verl"]
    assert len(verl) == 1 and verl[0].schema == "file" and os.path.isdir(verl[0].path)
