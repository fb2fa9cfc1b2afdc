"""The official script's knobs: short config keys, their environment variables, and the verl keys they feed.

verl's examples/grpo_trainer/run_qwen3_4b_fsdp.sh is driven by environment variables (MODEL_PATH, ROLLOUT_N, ...).
grpo-lab keeps one value per knob: a short top-level key in conf/config.yaml that verl's own key interpolates.
The same name in the environment sets it, with this precedence: command line > environment > config files.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
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

_OVERRIDE_KEY = re.compile(r"^[+~]{0,2}([A-Za-z_][\w.@/-]*)=")


def override_keys(args: list[str]) -> set[str]:
    """The config keys that command-line overrides set (`a.b=1`, `+a.b=1`, `~a.b`)."""
    keys = set()
    for arg in args:
        m = _OVERRIDE_KEY.match(arg)
        if m:
            keys.add(m.group(1))
        elif arg.startswith("~"):
            keys.add(arg.lstrip("~"))
    return keys


def env_overrides(args: list[str], environ: dict[str, str] | None = None) -> list[str]:
    """Overrides for the knobs set in the environment and not on the command line (the command line wins)."""
    environ = os.environ if environ is None else environ
    given = override_keys(args)
    out = []
    for knob in KNOBS:
        value = environ.get(knob.env)
        if value is None or value == "" or knob.key in given or knob.verl_key in given:
            continue
        out.append(f"{knob.key}={_quote(value)}")
    return out


def _quote(value: str) -> str:
    # Hydra's override grammar: paths and plain words pass as they are; anything else is quoted
    if re.fullmatch(r"[\w./:@~+-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


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


def misspelt_keys(args: list[str]) -> dict[str, str]:
    """Top-level command-line keys close to a short key, e.g. rollout_gpu_mem_utils=0.5."""
    top = [k for k in override_keys(args) if "." not in k and "/" not in k]
    # a config group (rollout=sglang_tp1_mem04) is no misspelt short key (rollout_n), however close the names are
    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
    groups = {d for d in os.listdir(conf) if os.path.isdir(os.path.join(conf, d))} if os.path.isdir(conf) else set()
    return near_misses([k for k in top if k not in groups], SHORT_KEYS)


def apply_env_knobs(argv: list[str], environ: dict[str, str] | None = None, err=sys.stderr) -> list[str]:
    """argv with the environment's knobs added as overrides; near misses are pointed out on `err`."""
    for wrong, right in misspelt_env(environ).items():
        print(f"grpo-lab: warning: environment variable {wrong} is not a grpo-lab knob and is ignored; "
              f"did you mean {right}?", file=err)
    for wrong, right in misspelt_keys(argv[1:]).items():
        print(f"grpo-lab: error: '{wrong}' is not a config key; did you mean '{right}'? "
              f"(e.g. python run.py {right}=...)", file=err)
        raise SystemExit(2)
    return argv + env_overrides(argv[1:], environ)
