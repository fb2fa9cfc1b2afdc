"""The official script's knobs: short keys, their environment variables, the verl keys they feed: docs/cli.md."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any

from grpo_lab import facts

# `${key}` or `${oc.select:key,default}`: a value that is exactly another key's
_FOLLOW = re.compile(r"\$\{(?:oc\.select:)?([A-Za-z_][\w.]*)(?:,[^}]*)?\}")


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


def misspelt_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Upper-case names that are no knob's but close to one: {misspelt: meant}."""
    return {name: match[0] for name in environ if name.isupper() and name not in ENV_NAMES
            and (match := difflib.get_close_matches(name, ENV_NAMES, n=1, cutoff=0.85))}


# ---- the follower table: which keys a short key feeds, in conf/config.yaml and in verl's composed config ----


def _walk(node: Any, prefix: str, out: dict[str, list[str]]) -> None:
    if isinstance(node, Mapping):
        for k, v in node.items():
            _walk(v, f"{prefix}{k}.", out)
    elif isinstance(node, str):
        m = _FOLLOW.fullmatch(node.strip())
        if m:
            out.setdefault(m.group(1), []).append(prefix[:-1])


@functools.cache
def our_followers() -> dict[str, tuple[str, ...]]:
    """key -> the keys whose value is exactly `${key}` in conf/config.yaml (short keys included)."""
    out: dict[str, list[str]] = {}
    ours = facts.load_yaml_or(facts.CONF / "config.yaml", {})
    _walk({k: v for k, v in ours.items() if k not in ("hydra", "defaults", "lab", "preflight")}, "", out)
    return {k: tuple(dict.fromkeys(v)) for k, v in out.items()}


@functools.cache
def followers() -> dict[str, tuple[str, ...]]:
    """key -> the keys whose value is exactly `${key}`: in conf/config.yaml and in verl's composed ppo_trainer."""
    from grpo_lab.verl_schema import schema

    out: dict[str, list[str]] = {k: list(v) for k, v in our_followers().items()}
    _walk(schema().tree, "", out)
    return {k: tuple(dict.fromkeys(v)) for k, v in out.items()}


def moved_with(key: str, old: Any, value_of: Callable[[str], Any], skip: Container[str]) -> list[str]:
    """The keys that move with `key` when it moves from `old`: those that follow it (`${key}`), directly or through one
    another, and still hold `old` (value_of: a key's value now); none in `skip` (set on their own, or moved already)."""
    out: list[str] = []
    todo = [key]
    while todo:
        for f in followers().get(todo.pop(), ()):
            if f != key and f not in out and f not in skip and value_of(f) == old:
                out.append(f)
                todo.append(f)
    return out


def short_key_targets(key: str) -> tuple[str, ...]:
    """The verl keys a short key sets (conf/config.yaml's `${key}`), or the knob table's verl key."""
    return followers().get(key) or tuple(k.verl_key for k in KNOBS if k.key == key)


def knob_keys(key: str) -> tuple[str, ...]:
    """The keys conf/config.yaml builds from a short key, directly or through one another (log_prob_micro_batch...:
    the rollout's key, and the ref's, which reads the rollout's)."""
    out: list[str] = []
    todo = list(our_followers().get(key, ()))
    while todo:
        k = todo.pop(0)
        if k not in out:
            out.append(k)
            todo += our_followers().get(k, ())
    return tuple(out)
