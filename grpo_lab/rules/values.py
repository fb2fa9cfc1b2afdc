"""Rules on single values verl accepts without a word and then fails on, or trains nothing with."""

from __future__ import annotations

from typing import Any, Iterable

from grpo_lab.facts import preset_learning_rates
from grpo_lab.knobs import KNOBS
from grpo_lab.rules import A, ALT, Ctx, Problem, error, rule, warn

_SHORT = {k.verl_key: k.key for k in KNOBS}

# verl 0.9.1's estimators that compare the answers of one prompt (verl/trainer/ppo/core_algos.py, grouped by the
# prompt `index`): with one answer per prompt there is no group. grpo/rloo/opo/gpg/reinforce_plus_plus_baseline then
# use the raw score with no baseline (their `len(id2score[idx]) == 1` branch), the vectorized ones give zero
# advantages, grpo_passk raises "Pass@k requires at least 2 samples per group".
GROUP_ESTIMATORS = frozenset({"grpo", "grpo_vectorized", "grpo_passk", "gdpo", "rloo", "rloo_vectorized", "opo",
                              "reinforce_plus_plus_baseline", "gpg", "optimal_token_baseline",
                              "tir_optimal_token_baseline"})


def override_key(verl_key: str) -> str:
    """The key a user types for this verl key: its short knob when there is one."""
    return _SHORT.get(verl_key, verl_key)


# (verl key, int or float, lowest allowed, value of the fix, what goes wrong otherwise)
NUMBERS: tuple[tuple[str, type, float, Any, str], ...] = (
    ("trainer.n_gpus_per_node", int, 1, 1,
     "verl builds a Ray resource pool with no GPU and Ray stops after ~40 s with 'Bundles must be a non-empty list'"),
    ("trainer.nnodes", int, 1, 1, "verl builds a Ray resource pool with no node"),
    ("data.train_batch_size", int, 1, 128, "there is no batch to train on"),
    (A + "actor.ppo_mini_batch_size", int, 1, 64, "there is no mini-batch to update with"),
    (A + "rollout.n", int, 1, 5, "no answer is generated"),
    ("data.max_prompt_length", int, 1, 512, "every prompt is too long (filter_overlong_prompts drops them all)"),
    ("data.max_response_length", int, 1, 1024, "vLLM may generate no token: every answer is empty and scores 0"),
    ("trainer.total_epochs", int, 1, 1,
     "verl's step count, steps per epoch x total_epochs, is not positive: no training step runs"),
    (A + "rollout.tensor_model_parallel_size", int, 1, 1, "vLLM cannot place a replica"),
    (A + "actor.ppo_max_token_len_per_gpu", int, 1, 4096, "dynamic batching has no token budget"),
    (A + "actor.optim.lr", float, 0, 1e-6,
     "the learning rate must be a positive number: at 0 the actor never changes, below 0 it moves away from reward"),
    (A + "actor.kl_loss_coef", float, 0, 0.001, "a negative KL coefficient pushes the actor away from the reference"),
    # null (verl's default) lets the epochs decide: steps per epoch x total_epochs
    ("trainer.total_training_steps", int, 1, "null",
     "verl ends training once its step count reaches total_training_steps (ray_trainer.py: is_last_step = "
     "global_steps >= total_training_steps), and the count starts at 1: it trains one step and stops, not 'no limit'. "
     "null lets total_epochs decide"),
)

# a learning rate from here up is warned: GRPO fine-tunes a pretrained model with rates around 1e-6 to 1e-5
LR_WARN = 1e-3


def _is(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind is int else isinstance(value, (int, float))


@rule("value_types")
def value_types(c: Ctx) -> Iterable[Problem]:
    """A number verl needs given as text (train_batch_size=abc): named, not read as 0."""
    for key, kind, _, fix, why in NUMBERS:
        v = c.get(key)
        if v is None or _is(v, kind):
            continue
        if kind is int and isinstance(v, float) and v.is_integer():
            continue
        what = "a whole number" if kind is int else "a number"
        yield error(f"{key}={v!r} is not {what} (a {type(v).__name__}): verl would fail on it, or {why}",
                    f"{override_key(key)}={fix}")


@rule("value_range")
def value_range(c: Ctx) -> Iterable[Problem]:
    """Numbers below what verl can use (ngpus_per_node=0, actor_lr=-1e-6, total_epochs=-1, max_response_length=0)."""
    for key, kind, lo, fix, why in NUMBERS:
        v = c.get(key)
        if v is None or not _is(v, kind) and not (kind is int and isinstance(v, float)):
            continue
        bad = v <= 0 if (kind is float and lo == 0 and key.endswith("optim.lr")) else v < lo
        if bad:
            if key == "trainer.n_gpus_per_node" and c.launching:
                from grpo_lab.facts import visible_gpus

                fix = max(1, visible_gpus(c.environ)[0])
            bound = "above 0" if key.endswith("optim.lr") else f"at least {lo:g}"
            yield error(f"{key}={v!r} must be {bound}: {why}", f"{override_key(key)}={fix}")


@rule("group_size")
def group_size(c: Ctx) -> Iterable[Problem]:
    est = str(c.get("algorithm.adv_estimator", "gae"))
    n = c.get(A + "rollout.n", 1)
    if est in GROUP_ESTIMATORS and _is(n, int) and n == 1:
        yield error(f"algorithm.adv_estimator={est} compares the answers of one prompt with each other, and "
                    f"rollout.n=1 gives each prompt one answer: there is no group (verl's {est} then uses the raw "
                    f"score with no baseline, a vectorized estimator gives zero advantages, grpo_passk raises). "
                    f"The guide's group is 5 answers", "rollout_n=5")


@rule("learning_rate_high")
def learning_rate_high(c: Ctx) -> Iterable[Problem]:
    """actor_lr=1.0 or 1e-3 (a typo of 1e-6, a supervised fine-tuning habit): AdamW moves every weight by about the
    learning rate each step, so the pretrained model is overwritten within a few steps. The presets' rates: conf/."""
    key = A + "actor.optim.lr"
    v = c.get(key)
    if not _is(v, float) or v < LR_WARN:
        return
    presets = preset_learning_rates()
    used = "; ".join(f"{lr:g} ({f})" for lr, f in presets) or "none found under conf/"
    yield warn(f"{key}={v:g} is {LR_WARN:g} or more: AdamW moves every weight by about the learning rate at each "
               f"update, {v / max(lr for lr, _ in presets or ((1e-6, ''),)):.0f}x the largest rate of the presets, "
               f"and a pretrained model is overwritten within a few steps (its answers turn to noise, the rewards "
               f"fall to the floor). The presets use {used}",
               # verl's key: it wins over actor_lr, ACTOR_LR and a config file's value, however the rate was given
               ALT.join(dict.fromkeys(f"{key}={lr:g}" for lr, _ in presets)))
