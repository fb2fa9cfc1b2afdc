"""verl's schema through its public API (grpo_lab.verl_schema): what each part holds is what verl's own objects say,
read in a child process, with nothing of verl imported here and none of its source parsed."""

from __future__ import annotations

import ast
import re

import pytest
from conftest import ROOT
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf, open_dict

from grpo_lab.verl_schema import build, schema
from grpo_lab.verl_schema.verl_paths import verl_config_dir

VERL = verl_config_dir()
A = "verl.workers.config."


@pytest.fixture(scope="module")
def s():
    got = schema()
    assert got.origin in ("file", "built") and got.problems == {}, got.problems
    return got


def test_the_tree_is_hydras_own_composition_of_verls_files(s):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=VERL, version_base=None):
        cfg = compose("ppo_trainer", return_hydra_config=True)
    with open_dict(cfg):
        del cfg["hydra"]
    assert s.tree == OmegaConf.to_container(cfg, resolve=False)
    assert list(s.tree) == list(cfg)  # the same order: verl_config.yaml reads the same
    assert s.defaults == OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    assert s.tree["data"]["max_response_length"] == s.defaults["data"]["max_response_length"]
    assert s.tree["actor_rollout_ref"]["rollout"]["response_length"].startswith("${")  # not resolved
    assert isinstance(s.defaults["actor_rollout_ref"]["rollout"]["response_length"], int)


def test_fields_are_the_dataclass_fields_behind_a_target(s):
    actor = s.fields(A + "FSDPActorConfig")
    assert {"strategy", "ppo_mini_batch_size", "use_dynamic_bsz", "fsdp_config", "_target_"} <= actor
    assert "_mutable_fields" not in actor  # a class attribute, not a field
    # inherited from a class in another module (verl.trainer.config.CheckpointConfig): reading the source by class
    # name missed these
    assert {"mbridge_config", "save_contents", "load_contents"} <= s.fields(A + "McoreCheckpointConfig")
    assert s.fields("verl.no_such_module.NoSuchConfig") is None
    assert s.fields("recipe.langgraph_agent.react_agent_loop.ReactAgentLoop") is None  # not a dataclass of verl's
    # every `_target_` of the composed tree has its fields
    targets = build.targets(VERL, s.tree)
    assert A + "HFModelConfig" in targets
    node = s.tree["actor_rollout_ref"]["rollout"]
    assert set(node) - {"_target_"} <= s.fields(node["_target_"])


def test_model_keys(s):
    assert {"path", "use_remove_padding", "enable_gradient_checkpointing", "override_config", "lora_rank"} \
        <= s.model_keys
    assert "hf_model.yaml" in s.model_keys_from and "HFModelConfig in verl/workers/config/model.py" \
        in s.model_keys_from
    assert s.fields(A + "HFModelConfig") <= s.model_keys


def test_rollout_engines(s):
    assert {("vllm", "async"), ("sglang", "async")} <= s.rollout_engines
    assert {"vllm", "sglang"} <= s.rollout_servers
    assert "hf" not in s.rollout_servers  # verl's YAML comment names it; its registries do not
    assert "_ROLLOUT_REGISTRY" in s.rollout_from


def test_data_sources_verls_scorer_knows(s):
    assert {"openai/gsm8k", "lighteval/MATH", "hiyouga/geometry3k", "searchR1_nq"} <= s.data_sources
    assert s.data_source_prefixes == ("aime",)
    assert s.knows_data_source("openai/gsm8k") and s.knows_data_source("aime2024")
    assert s.knows_data_source("arith_mixed_oneshot") is False and s.knows_data_source("own_qa") is False


def test_the_probe_reads_a_scorer_by_calling_it():
    ran = []

    def score(data_source, solution_str, ground_truth):
        if data_source == "a/b":
            ran.append("a/b")
        elif data_source in ["c", "d"] or data_source in ("e",) or data_source.startswith(("f_", "g_")):
            ran.append("cdefg")
        elif data_source.startswith("h"):
            ran.append("h")
        else:
            raise NotImplementedError(f"Reward function is not implemented for {data_source=}")

    assert build.scorer_sources(score) == {"names": ["a/b", "c", "d", "e"], "prefixes": ["f_", "g_", "h"]}
    assert ran == []  # no branch ran

    def takes_anything(data_source, solution_str, ground_truth):
        return 0.0

    with pytest.raises(RuntimeError, match="without raising NotImplementedError"):
        build.scorer_sources(takes_anything)


def test_one_object_per_process():
    assert schema() is schema()
    assert schema(VERL) is schema()


def _sources(folders) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for d in folders for p in sorted((ROOT / d).rglob("*.py"))}


def test_hydras_internals_are_used_in_one_module_only():
    users = sorted(path for path, text in _sources(["grpo_lab", "hydra_plugins"]).items()
                   if "hydra._internal" in text or "_get_header_dict" in text or "hydra.version" in text
                   or re.search(r"from hydra import version\b", text))
    assert users == ["grpo_lab/verl_schema/hydra_internals.py"]


def test_verl_schema_imports_nothing_of_the_cli_stage():
    for path, text in _sources(["grpo_lab/verl_schema"]).items():
        for node in ast.walk(ast.parse(text)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("grpo_lab.cli") for n in names), path
