"""Rules on single values verl accepts without a word and then fails on, or trains nothing with."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from grpo_lab.verl_keys import get as _get
from grpo_lab.facts import preset_learning_rates
from grpo_lab.cli.config import safe_name, unsafe_name
from grpo_lab.cli.knobs import KNOBS
from grpo_lab.checks.rules import A, ALT, Ctx, Problem, error, rule, warn

_SHORT = {k.verl_key: k.key for k in KNOBS}

# verl 0.9.1's estimators that compare the answers of one prompt (verl/trainer/ppo/core_algos.py, grouped by the
# prompt `index`), and what each does with a group of one answer (rollout.n=1): grpo_passk raises; the others run.
GROUP_ESTIMATORS: dict[str, str] = {
    "grpo": "the raw score as the advantage, no baseline (mean 0, std 1: compute_grpo_outcome_advantage)",
    "gdpo": "the raw scores, no baseline, whitened over the batch (compute_gdpo_outcome_advantage via GRPO's)",
    "grpo_vectorized": "the raw score as the advantage, no baseline (verl/utils/groupwise.py group_mean_std: a "
                       "singleton group gets mean 0, std 1)",
    "rloo": "the raw score as the advantage, no leave-one-out baseline (compute_rloo_outcome_advantage)",
    "rloo_vectorized": "zero advantages for every answer ((c > 1) mask: compute_rloo_vectorized_outcome_advantage): "
                       "no policy gradient at all, only the KL and entropy terms move the actor",
    "opo": "the raw score as the advantage, no baseline (compute_opo_outcome_advantage)",
    "gpg": "the raw score as the advantage, no baseline (compute_gpg_outcome_advantage)",
    "reinforce_plus_plus_baseline": "the raw score, no group baseline, whitened over the batch "
                                    "(compute_reinforce_plus_plus_baseline_outcome_advantage)",
    "optimal_token_baseline": "the return as the advantage, no baseline (compute_optimal_token_baseline_advantage: "
                              "'Single trajectory - no baseline')",
    "tir_optimal_token_baseline": "the return as the advantage, no baseline (its N == 1 branch)",
    "grpo_passk": "",  # raises: group_size's error
}


def override_key(verl_key: str) -> str:
    """The key a user types for this verl key: its short knob when there is one."""
    return _SHORT.get(verl_key, verl_key)


# (verl key, int or float, lowest allowed (None: any, or another rule's range), value of the fix, what goes wrong)
NUMBERS: tuple[tuple[str, type, float | None, Any, str], ...] = (
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
    # (0 itself runs and trains nothing: learning_rate_zero's warning)
    (A + "actor.optim.lr", float, 0, 1e-6,
     "torch refuses it when verl builds the actor's optimizer, after Ray and the model have started "
     "(torch.optim.AdamW: 'ValueError: Invalid learning rate'); a negative rate would move away from reward"),
    (A + "actor.kl_loss_coef", float, 0, 0.001, "a negative KL coefficient pushes the actor away from the reference"),
    # null (verl's default) lets the epochs decide: steps per epoch x total_epochs
    ("trainer.total_training_steps", int, 1, "null",
     "verl ends training once its step count reaches total_training_steps (ray_trainer.py: is_last_step = "
     "global_steps >= total_training_steps), and the count starts at 1: it trains one step and stops, not 'no limit'. "
     "null lets total_epochs decide"),
    # the types only: the micro-batch rules (rules.batch) judge their sizes; 0 or -1 are "never" for the frequencies
    (A + "actor.ppo_micro_batch_size_per_gpu", int, None, 2, "the actor update has no micro-batch size"),
    (A + "rollout.log_prob_micro_batch_size_per_gpu", int, None, 2, "the log-prob pass has no micro-batch size"),
    (A + "ref.log_prob_micro_batch_size_per_gpu", int, None, 2, "the reference pass has no micro-batch size"),
    (A + "actor.entropy_coeff", float, None, 0, "the entropy term has no coefficient"),
    ("trainer.test_freq", int, None, 10, "validation has no interval"),
    ("trainer.save_freq", int, None, 50, "checkpoints have no interval"),
)

# a learning rate from here up is warned: GRPO fine-tunes a pretrained model with rates around 1e-6 to 1e-5
LR_WARN = 1e-3


def _is(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind is int else isinstance(value, (int, float))


def wrong_types(c: Ctx) -> Iterator[tuple[str, Any, Any, str, Any, str]]:
    """(key, value, verl's default, what it must be, fix value, why) of each number verl needs that is no number, or
    null where verl's own default is a number. A key that only follows one named already (the ref's log-prob
    micro-batch reads the rollout's) is not named again."""
    from grpo_lab.cli.knobs import followers
    from grpo_lab.verl_schema import schema

    named: dict[str, Any] = {}
    for key, kind, _, fix, why in NUMBERS:
        v = c.get(key)
        default = _get(schema().defaults, key)
        if v is None and default is None or _is(v, kind):
            continue
        if kind is int and isinstance(v, float) and v.is_integer():
            continue
        if any(key in followers().get(k, ()) and named[k] == v for k in named):
            continue
        named[key] = v
        yield key, v, default, "a whole number" if kind is int else "a number", fix, why


@rule("value_types", kind="values", phase="compose")
def value_types(c: Ctx) -> Iterable[Problem]:
    """A number verl needs given as text (train_batch_size=abc) or null: named, not read as 0."""
    for key, v, default, what, fix, why in wrong_types(c):
        if v is None:
            yield error(f"{key}=null is not {what} (verl's own default is {default}): verl would fail on it, or "
                        f"{why}", f"{override_key(key)}={fix}")
        else:
            yield error(f"{key}={v!r} is not {what} (a {type(v).__name__}): verl would fail on it, or {why}",
                        f"{override_key(key)}={fix}")


@rule("value_range", kind="values", phase="compose")
def value_range(c: Ctx) -> Iterable[Problem]:
    """Numbers below what verl can use (ngpus_per_node=0, actor_lr=-1e-6, total_epochs=-1, max_response_length=0)."""
    for key, kind, lo, fix, why in NUMBERS:
        v = c.get(key)
        if lo is None or v is None or not _is(v, kind) and not (kind is int and isinstance(v, float)):
            continue
        if v < lo:
            if key == "trainer.n_gpus_per_node" and c.launching:
                from grpo_lab.facts import visible_gpus

                fix = max(1, visible_gpus(c.environ)[0])
            yield error(f"{key}={v!r} must be at least {lo:g}: {why}", f"{override_key(key)}={fix}")


@rule("learning_rate_zero", kind="values", phase="update")
def learning_rate_zero(c: Ctx) -> Iterable[Problem]:
    """actor_lr=0: torch's AdamW takes it (it refuses only a negative rate) and verl runs every step, generation,
    rewards and all, but each update moves every weight by lr x (its Adam step + weight decay) = 0: nothing is
    learned, at the full cost of the run."""
    key = A + "actor.optim.lr"
    v = c.get(key)
    if _is(v, float) and v == 0:
        yield warn(f"{key}=0: verl 0.9.1 runs it (torch.optim.AdamW accepts a rate of 0), but every actor update then "
                   f"moves no weight, so the run generates and scores answers at full cost and the actor never changes "
                   f"(the rewards stay where they start)", f"{override_key(key)}=1e-06")


@rule("group_size", kind="values", phase="update")
def group_size(c: Ctx) -> Iterable[Problem]:
    """rollout.n=1 with an estimator that compares the answers of one prompt: grpo_passk raises in verl 0.9.1, the
    others run with no baseline (GROUP_ESTIMATORS says what each does)."""
    est = str(c.get("algorithm.adv_estimator", "gae"))
    n = c.get(A + "rollout.n", 1)
    if est not in GROUP_ESTIMATORS or not _is(n, int) or n != 1:
        return
    what = (f"algorithm.adv_estimator={est} compares the answers of one prompt with each other, and rollout.n=1 gives "
            f"each prompt one answer: there is no group")
    if est == "grpo_passk":
        yield error(f"{what}, and verl 0.9.1 raises 'ValueError: Pass@k requires at least 2 samples per group. Got 1 "
                    f"for group ...' at the first advantage computation, after the first generation "
                    f"(verl/trainer/ppo/core_algos.py compute_grpo_passk_outcome_advantage). The guide's group is 5 "
                    f"answers", "rollout_n=5")
    else:
        yield warn(f"{what}. verl 0.9.1 runs it (verl/trainer/ppo/core_algos.py) with {GROUP_ESTIMATORS[est]}: not "
                   f"the group-relative signal {est} is for. The guide's group is 5 answers", "rollout_n=5")


@rule("learning_rate_high", kind="values", phase="update")
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


@rule("experiment_name_folder", kind="values", phase="compose")
def experiment_name_folder(c: Ctx) -> Iterable[Problem]:
    """trainer.experiment_name names the run's folder and its checkpoints': a safe folder name (the command line's
    own value is refused before composing: grpo_lab/cli/overrides.py)."""
    key = "trainer.experiment_name"
    name = c.get(key)
    why = unsafe_name(key, name, override_key(key)) if isinstance(name, str) else ""
    if why:
        yield error(why, f"{override_key(key)}={safe_name(name)}")
