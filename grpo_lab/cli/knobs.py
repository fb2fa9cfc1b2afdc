"""The official script's knobs: short config keys, their environment variables, and the verl keys they feed.

verl's examples/grpo_trainer/run_qwen3_4b_fsdp.sh is driven by environment variables (MODEL_PATH, ROLLOUT_N, ...).
grpo-lab keeps one value per knob: a short top-level key in conf/config.yaml that verl's own key interpolates.
The same name in the environment sets it, with this precedence: command line > environment > config files.
This module is the table; grpo_lab/cli/overrides.py parses the command line and adds the environment's knobs to it.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Knob:
    env: str
    key: str
    verl_key: str


KNOBS: tuple[Knob, ...] = (
    Knob("MODEL_PATH", "model_path", "actor_rollout_ref.model.path"),
    Knob("TRAIN_FILE", "train_file", "data.train_files"),
    Knob("TEST_FILE", "test_file", "data.val_files"),
    Knob("NNODES", "nnodes", "trainer.nnodes"),
    Knob("NGPUS_PER_NODE", "ngpus_per_node", "trainer.n_gpus_per_node"),
    Knob("TRAIN_BATCH_SIZE", "train_batch_size", "data.train_batch_size"),
    Knob("PPO_MINI_BATCH_SIZE", "ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"),
    Knob("PPO_MICRO_BATCH_SIZE_PER_GPU", "ppo_micro_batch_size_per_gpu",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    Knob("LOG_PROB_MICRO_BATCH_SIZE_PER_GPU", "log_prob_micro_batch_size_per_gpu",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
    Knob("MAX_PROMPT_LENGTH", "max_prompt_length", "data.max_prompt_length"),
    Knob("MAX_RESPONSE_LENGTH", "max_response_length", "data.max_response_length"),
    Knob("ROLLOUT_N", "rollout_n", "actor_rollout_ref.rollout.n"),
    Knob("ROLLOUT_TP", "rollout_tp", "actor_rollout_ref.rollout.tensor_model_parallel_size"),
    Knob("ROLLOUT_GPU_MEM_UTIL", "rollout_gpu_mem_util", "actor_rollout_ref.rollout.gpu_memory_utilization"),
    Knob("ACTOR_LR", "actor_lr", "actor_rollout_ref.actor.optim.lr"),
    Knob("KL_LOSS_COEF", "kl_loss_coef", "actor_rollout_ref.actor.kl_loss_coef"),
    Knob("ENTROPY_COEFF", "entropy_coeff", "actor_rollout_ref.actor.entropy_coeff"),
    Knob("PPO_MAX_TOKEN_LEN_PER_GPU", "ppo_max_token_len_per_gpu", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
    Knob("TOTAL_EPOCHS", "total_epochs", "trainer.total_epochs"),
    Knob("TEST_FREQ", "test_freq", "trainer.test_freq"),
    Knob("SAVE_FREQ", "save_freq", "trainer.save_freq"),
    Knob("PROJECT_NAME", "project_name", "trainer.project_name"),
    Knob("EXPERIMENT_NAME", "experiment_name", "trainer.experiment_name"),
)

SHORT_KEYS: frozenset[str] = frozenset(k.key for k in KNOBS)
ENV_NAMES: frozenset[str] = frozenset(k.env for k in KNOBS)


def near_misses(names: list[str], known: frozenset[str], cutoff: float = 0.85) -> dict[str, str]:
    """Names that are not known but close to a known one: {misspelt: meant}."""
    out = {}
    for name in names:
        if name in known:
            continue
        match = difflib.get_close_matches(name, known, n=1, cutoff=cutoff)
        if match:
            out[name] = match[0]
    return out


def misspelt_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return near_misses([n for n in environ if n.isupper()], ENV_NAMES)
