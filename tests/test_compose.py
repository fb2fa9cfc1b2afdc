"""The config tree composes into a verl config that verl's own checks accept, with the guide's numbers."""

from __future__ import annotations

import copy
from dataclasses import asdict

import pytest
from conftest import CONF, compose_split, options, run_py
from omegaconf import OmegaConf

from grpo_lab import facts
from grpo_lab.verl_keys import get

GROUPS = ["hardware", "model", "rollout", "variant", "dataset", "logger", "speed", "experiment"]
# vLLM's allowed LoRA ranks (vllm.config.lora.MaxLoRARanks; verl checks a LoRA rank against them when vLLM is there)
VLLM_LORA_RANKS = {1, 8, 16, 32, 64, 128, 256, 320, 512}


def test_every_group_has_the_issue_options():
    assert {"rtx4080x4", "rtx4080_16gbx4", "h200x1", "a100_80gbx8"} <= set(options("hardware"))
    assert {"qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_1_7b_base", "qwen3_4b_base", "qwen3_8b_lora"} <= set(
        options("model"))
    assert {"tp1_mem04", "tp2_mem06"} <= set(options("rollout"))
    assert {"grpo", "dapo", "dr_grpo", "gspo"} <= set(options("variant"))
    assert {"smoke", "smoke_tiny", "qwen3_1_7b_gsm8k", "qwen3_4b_gsm8k"} <= set(options("experiment"))


def test_no_option_shadows_verl_config_files():
    # verl has groups `model` (hf_model) and `rollout` (rollout): an option of ours with the same name would replace
    # verl's own file wherever ppo_trainer.yaml loads it
    from pathlib import Path

    from grpo_lab.verl_schema.verl_paths import verl_config_dir

    verl = Path(verl_config_dir())
    for group in GROUPS:
        ours = set(options(group))
        theirs = {p.stem for p in (verl / group).glob("*.yaml")} if (verl / group).is_dir() else set()
        assert not ours & theirs, f"conf/{group}/ shadows verl's {ours & theirs}"


def test_every_config_file_has_a_header_with_a_command():
    for path in sorted(CONF.rglob("*.yaml")):
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        comments = []
        for line in lines:
            if not line.startswith("#"):
                break
            comments.append(line)
        text = "\n".join(comments)
        assert len(comments) >= 2, f"{path} lacks a comment header"
        assert "run.py" in text or "make " in text, f"{path}'s header does not show the command that uses it"


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(group, option):
    verl, lab = compose_split(f"{group}={option}")
    assert verl["actor_rollout_ref"]["model"]["path"]
    assert "lab" not in verl and "rollout_gpu_mem_util" not in verl and "preflight" not in verl
    assert lab.hardware.gpu_memory_gb > 0


def test_defaults_are_the_guides_real_run():
    verl, lab = compose_split("speed=guide")
    assert lab.hardware.name == "rtx4080x4" and lab.model.name == "qwen3_1_7b"
    assert get(verl, "actor_rollout_ref.model.path") == "Qwen/Qwen3-1.7B"
    assert get(verl, "trainer.n_gpus_per_node") == 4
    assert get(verl, "actor_rollout_ref.rollout.tensor_model_parallel_size") == 1
    assert get(verl, "actor_rollout_ref.rollout.gpu_memory_utilization") == 0.4
    assert get(verl, "data.train_files").endswith("data/gsm8k/train.parquet")
    assert get(verl, "data.val_files").endswith("data/gsm8k/test.parquet")
    # the official script's settings (SPEC.md, "Commands the source runs")
    expected = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.use_kl_in_reward": False,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        "actor_rollout_ref.actor.use_kl_loss": True,
        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
        "actor_rollout_ref.actor.kl_loss_coef": 0.001,
        "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 3000,
        "actor_rollout_ref.actor.optim.lr": 1e-6,
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 4096,
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": 8192,
        "actor_rollout_ref.ref.fsdp_config.param_offload": True,
        "actor_rollout_ref.rollout.free_cache_engine": True,
        "actor_rollout_ref.rollout.enable_chunked_prefill": False,
        "actor_rollout_ref.rollout.n": 5,
        "actor_rollout_ref.rollout.name": "vllm",
    }
    for key, value in expected.items():
        assert get(verl, key) == value, key


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


def _job_config(*args: str) -> dict:
    import yaml

    p = run_py("--cfg", "job", "--resolve", *args)
    assert p.returncode == 0, p.stderr
    return _flat(yaml.safe_load(p.stdout))


SPEED_KEYS = {"actor_rollout_ref.model.use_fused_kernels", "actor_rollout_ref.model.use_remove_padding",
              "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "ppo_max_token_len_per_gpu",
              "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
              "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"}


@pytest.mark.slow
def test_the_default_is_faster_and_the_guides_settings_are_one_switch_away():
    """Issue 27: the presets run the faster settings by default; speed=guide gives the script's exact ones back, and
    the two differ in nothing else (same batch, group size, lengths, learning rate and loss)."""
    for preset in ("experiment=qwen3_1_7b_gsm8k", "experiment=smoke"):
        fast, guide = _job_config(preset), _job_config(preset, "speed=guide")
        changed = {k for k in fast.keys() | guide.keys() if fast.get(k) != guide.get(k)}
        # verl copies the model's two switches into its engine sections; ours are the keys above
        assert {k for k in changed if not k.endswith(("use_fused_kernels", "use_remove_padding"))} <= SPEED_KEYS
        assert {k: fast[k] for k in SPEED_KEYS} == {k: 16384 for k in SPEED_KEYS if "token_len" in k} | {
            "actor_rollout_ref.model.use_fused_kernels": True, "actor_rollout_ref.model.use_remove_padding": True}
        assert guide["actor_rollout_ref.model.use_fused_kernels"] is False
        assert guide["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 3000
    # under sdpa the default pads each answer; the guide keeps verl's packed micro-batches
    sdpa = "++actor_rollout_ref.model.override_config.attn_implementation=sdpa"
    assert _job_config(sdpa)["actor_rollout_ref.model.use_remove_padding"] is False
    assert _job_config(sdpa, "speed=guide")["actor_rollout_ref.model.use_remove_padding"] is True


def test_hardware_sizes_ray_for_the_v1_trainer():
    for hw in options("hardware"):
        verl, lab = compose_split(f"hardware={hw}")
        if get(verl, "ray_kwargs.ray_init.address"):
            continue  # joins a running cluster: no num_cpus (tests/test_cluster.py)
        units = get(verl, "transfer_queue.backend.SimpleStorage.num_data_storage_units")
        need = facts.ray_cpus_needed(verl["trainer"]["n_gpus_per_node"], get(verl, "trainer.use_v1", True), units)
        cpus = get(verl, "ray_kwargs.ray_init.num_cpus")
        assert need <= cpus <= lab.hardware.cpu_cores, (hw, need, cpus)
        for key in ("gpu_memory_gb", "cpu_cores", "host_ram_gb", "interconnect"):
            assert getattr(lab.hardware, key) is not None, (hw, key)
        env = get(verl, "ray_kwargs.ray_init.runtime_env.env_vars") or {}
        assert all(isinstance(v, str) for v in env.values()), env
    verl, _ = compose_split("hardware=rtx4080x4")
    assert get(verl, "ray_kwargs.ray_init.runtime_env.env_vars.NCCL_P2P_DISABLE") == "1"


def test_group_files_win_over_the_primary_config():
    # _self_ comes right after ppo_trainer: a group file's value beats conf/config.yaml's
    verl, _ = compose_split("model=qwen3_8b_lora")
    assert get(verl, "actor_rollout_ref.actor.optim.lr") == 3e-6
    verl, _ = compose_split("rollout=tp2_mem06")
    assert get(verl, "actor_rollout_ref.rollout.gpu_memory_utilization") == 0.6


def test_command_line_reaches_verl_unchanged():
    verl, _ = compose_split("actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                            "trainer.total_training_steps=7")
    assert get(verl, "actor_rollout_ref.actor.fsdp_config.optimizer_offload") is True
    assert get(verl, "actor_rollout_ref.model.override_config.attn_implementation") == "sdpa"
    assert get(verl, "trainer.total_training_steps") == 7


def test_smoke_preset_is_the_guides_smoke_test():
    verl, lab = compose_split("experiment=smoke")
    assert lab.model.name == "qwen3_0_6b"
    assert get(verl, "actor_rollout_ref.model.path") == "Qwen/Qwen3-0.6B"
    assert get(verl, "trainer.n_gpus_per_node") == 4
    assert get(verl, "data.train_batch_size") == 32
    assert get(verl, "actor_rollout_ref.actor.ppo_mini_batch_size") == 16
    assert get(verl, "actor_rollout_ref.rollout.n") == 4
    assert get(verl, "data.max_response_length") == 512
    assert get(verl, "actor_rollout_ref.rollout.tensor_model_parallel_size") == 1
    assert get(verl, "actor_rollout_ref.rollout.gpu_memory_utilization") == 0.4
    assert get(verl, "trainer.total_training_steps") == 3
    assert get(verl, "trainer.val_before_train") is False
    assert get(verl, "trainer.project_name") == "course_grpo"
    assert get(verl, "trainer.experiment_name") == "smoke_qwen3_0_6b"
    assert "console" in get(verl, "trainer.logger")


def test_every_experiments_run_name_follows_the_model_chosen():
    """Issue 28 item 8: an experiment file named its runs after its own model whatever model= chose (experiment=smoke
    model=qwen3_4b ran in ..._smoke_qwen3_0_6b): each name now carries the model composed, and no other model's."""
    names = set(options("model"))
    for experiment in options("experiment"):
        for model in (None, "qwen3_4b"):
            verl, lab = compose_split(f"experiment={experiment}", *([f"model={model}"] if model else []))
            name, chosen = get(verl, "trainer.experiment_name"), lab.model.name
            assert chosen in name and not {n for n in names - {chosen} if n in name and n not in chosen}, \
                (experiment, model, name)
            assert get(verl, "trainer.default_local_dir").endswith(f"/{name}")


def test_a_runs_folder_is_named_after_the_model_chosen(tmp_path):
    out = run_py("experiment=smoke", "model=qwen3_4b", "preflight.only=true", cwd=tmp_path)
    runs = [p.name for p in (tmp_path / "outputs" / "runs").iterdir()]
    assert out.returncode in (0, 3) and len(runs) == 1 and runs[0].endswith("_smoke_qwen3_4b"), (runs, out.stderr)


@pytest.mark.parametrize("preset,model", [("qwen3_1_7b_gsm8k", "Qwen/Qwen3-1.7B"), ("qwen3_4b_gsm8k", "Qwen/Qwen3-4B")])
def test_real_run_presets_are_the_guides(preset, model):
    verl, _ = compose_split(f"experiment={preset}")
    assert get(verl, "actor_rollout_ref.model.path") == model
    numbers = {
        "data.train_batch_size": 128, "actor_rollout_ref.actor.ppo_mini_batch_size": 64,
        "actor_rollout_ref.rollout.n": 5, "data.max_prompt_length": 512, "data.max_response_length": 1024,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
        "actor_rollout_ref.rollout.gpu_memory_utilization": 0.4, "trainer.total_epochs": 2,
        "trainer.test_freq": 10, "trainer.save_freq": 50, "trainer.n_gpus_per_node": 4,
    }
    for key, value in numbers.items():
        assert get(verl, key) == value, key


# verl's examples/grpo_trainer/run_qwen3_4b_fsdp.sh with its defaults (NGPUS_PER_NODE=8, TRAIN_BATCH_SIZE=512,
# PPO_MINI_BATCH_SIZE=256, micro-batches 2, prompt and response 1024, ROLLOUT_TP=2, ROLLOUT_GPU_MEM_UTIL=0.6,
# ROLLOUT_N=5, SAVE_FREQ=20, TEST_FREQ=5, TOTAL_EPOCHS=15), key by key as the script passes them to verl.
OFFICIAL_SCRIPT = {
    "algorithm.adv_estimator": "grpo",
    "data.train_batch_size": 512,
    "data.max_prompt_length": 1024,
    "data.max_response_length": 1024,
    "data.filter_overlong_prompts": True,
    "data.truncation": "error",
    "algorithm.use_kl_in_reward": False,
    "actor_rollout_ref.model.path": "Qwen/Qwen3-4B",
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
    "actor_rollout_ref.actor.use_kl_loss": True,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff": 0,
    "actor_rollout_ref.actor.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 3000,
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 2,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
    "actor_rollout_ref.rollout.enable_chunked_prefill": False,
    "actor_rollout_ref.rollout.enforce_eager": False,
    "actor_rollout_ref.rollout.free_cache_engine": True,
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": True,
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 4096,
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": 4096,
    "actor_rollout_ref.rollout.n": 5,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 2,
    "actor_rollout_ref.ref.fsdp_config.param_offload": True,
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": True,
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": 8192,
    "trainer.critic_warmup": 0,
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
    "trainer.save_freq": 20,
    "trainer.test_freq": 5,
    "trainer.total_epochs": 15,
}


def test_official_script_parity():
    verl, _ = compose_split("hardware=a100_80gbx8", "rollout=tp2_mem06", "model=qwen3_4b", "speed=guide",
                            "train_batch_size=512", "ppo_mini_batch_size=256", "max_prompt_length=1024",
                            "max_response_length=1024", "save_freq=20", "test_freq=5", "total_epochs=15")
    mismatched = {k: (get(verl, k, "<missing>"), v) for k, v in OFFICIAL_SCRIPT.items()
                  if get(verl, k, "<missing>") != v}
    assert not mismatched


def _verl_checks(verl: dict) -> None:
    """verl's own validation, as its main_ppo runs it, plus the dataclass conversion of actor, rollout, algorithm."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    verl = copy.deepcopy(verl)
    lora_rank = get(verl, "actor_rollout_ref.model.lora_rank", 0)
    if lora_rank:
        # verl checks a LoRA rank against vLLM's list by importing vLLM, which a CPU machine lacks: check it here
        assert lora_rank in VLLM_LORA_RANKS
        verl["actor_rollout_ref"]["model"]["lora_rank"] = 0
    cfg = OmegaConf.create(verl)
    OmegaConf.set_struct(cfg, True)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    omega_conf_to_dataclass(cfg.algorithm)


MODELS = [m for m in options("model")]
VARIANTS = options("variant")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_verl_accepts_model_x_variant(model, variant):
    verl, _ = compose_split(f"model={model}", f"variant={variant}")
    _verl_checks(verl)


@pytest.mark.parametrize("hardware", options("hardware"))
@pytest.mark.parametrize("rollout", options("rollout"))
def test_verl_accepts_hardware_x_rollout(hardware, rollout):
    verl, _ = compose_split(f"hardware={hardware}", f"rollout={rollout}")
    _verl_checks(verl)


def test_verl_rejects_what_it_should():
    # the check above is real: verl refuses both micro-batch spellings at once (use *_per_gpu, SPEC.md)
    verl, _ = compose_split("actor_rollout_ref.actor.use_dynamic_bsz=false",
                            "actor_rollout_ref.actor.ppo_micro_batch_size=8")
    with pytest.raises(Exception, match="ppo_micro_batch_size_per_gpu"):
        _verl_checks(verl)


def test_variants_set_verl_09_keys():
    verl, _ = compose_split("variant=dapo")
    assert get(verl, "algorithm.filter_groups.enable") is True and get(verl, "algorithm.filter_groups.metric") == "acc"
    assert get(verl, "actor_rollout_ref.actor.clip_ratio_low") == 0.2
    assert get(verl, "actor_rollout_ref.actor.clip_ratio_high") == 0.28
    assert get(verl, "reward.reward_manager.name") == "dapo"
    assert get(verl, "reward.reward_kwargs.overlong_buffer_cfg.enable") is True
    assert get(verl, "reward.reward_kwargs.max_resp_len") == get(verl, "data.max_response_length")
    verl, _ = compose_split("variant=dr_grpo")
    assert get(verl, "algorithm.norm_adv_by_std_in_grpo") is False
    assert get(verl, "actor_rollout_ref.actor.loss_agg_mode") == "seq-mean-token-sum-norm"
    verl, _ = compose_split("variant=gspo")
    assert get(verl, "actor_rollout_ref.actor.policy_loss.loss_mode") == "gspo"
    assert get(verl, "actor_rollout_ref.actor.loss_agg_mode") == "seq-mean-token-mean"


def test_lora_model_has_what_makes_it_fit():
    verl, lab = compose_split("model=qwen3_8b_lora")
    assert get(verl, "actor_rollout_ref.model.lora_rank") > 0
    assert get(verl, "actor_rollout_ref.rollout.load_format") == "safetensors"
    assert get(verl, "actor_rollout_ref.rollout.layered_summon") is True
    assert get(verl, "actor_rollout_ref.actor.fsdp_config.param_offload") is True
    assert lab.model.tie_word_embeddings is False


def test_model_files_state_the_architecture():
    keys = {"num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "tie_word_embeddings"}
    for model in MODELS:
        _, lab = compose_split(f"model={model}")
        assert keys <= {k for k, v in asdict(lab.model).items() if v is not None}, model


def test_an_inherited_option_is_one_layer_for_provenance():
    # smoke_smollm2 takes smoke_tiny's start-up block through its defaults list (issue 29 item 6): the layer of the
    # option chosen carries what it inherits, so set_by names the option, as when the file repeated the block
    from grpo_lab.cli.provenance import Layers

    layers = Layers({"experiment": "smoke_smollm2"}, [])
    assert layers.set_by("ray_kwargs.ray_init.include_dashboard")[1] == "conf/experiment/smoke_smollm2.yaml"
    assert layers.set_by("data.train_batch_size")[1] == "conf/experiment/smoke_smollm2.yaml (train_batch_size)"
    assert layers.set_by("max_response_length")[1] == "conf/experiment/smoke_smollm2.yaml"  # its own, over smoke_tiny's
    assert lookup_layer(layers, "conf/experiment/smoke_smollm2.yaml")["max_response_length"] == 256


def lookup_layer(layers, name):
    return dict(layers.layers)[name]
