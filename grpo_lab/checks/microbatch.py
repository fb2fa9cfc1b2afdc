"""A user's micro-batch size wins over grpo-lab's dynamic batching default, or the plan says loudly that it is ignored.

Who set a value is grpo_lab/cli/provenance.py's answer (the same as plan.json's changed_defaults "set_by").

    info = settle(verl, layers)      # grpo_lab/launch/prepare.py, in place; lab.micro_batch = info for the rule

Why, and what happens to each pass: docs/preflight.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grpo_lab.memory.verl_view import VerlView
from grpo_lab.verl_keys import A

# (pass, its micro-batch keys (per GPU, and verl's deprecated global form), its dynamic batching switch, token budget)
PASSES: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("actor update", (A + "actor.ppo_micro_batch_size_per_gpu", A + "actor.ppo_micro_batch_size"),
     A + "actor.use_dynamic_bsz", A + "actor.ppo_max_token_len_per_gpu"),
    ("rollout log-prob", (A + "rollout.log_prob_micro_batch_size_per_gpu", A + "rollout.log_prob_micro_batch_size"),
     A + "rollout.log_prob_use_dynamic_bsz", A + "rollout.log_prob_max_token_len_per_gpu"),
    ("reference log-prob", (A + "ref.log_prob_micro_batch_size_per_gpu", A + "ref.log_prob_micro_batch_size"),
     A + "ref.log_prob_use_dynamic_bsz", A + "ref.log_prob_max_token_len_per_gpu"),
)


def _values(cfg: VerlView) -> list[tuple[tuple[Any, ...], bool, Any]]:
    """PASSES's values in this config, pass by pass: (its micro-batch sizes, dynamic batching on, token budget)."""
    actor, rollout, ref = cfg.actor, cfg.rollout, cfg.ref
    return [((actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size), bool(actor.use_dynamic_bsz),
             actor.ppo_max_token_len_per_gpu),
            ((rollout.log_prob_micro_batch_size_per_gpu, rollout.log_prob_micro_batch_size),
             bool(rollout.log_prob_use_dynamic_bsz), rollout.log_prob_max_token_len_per_gpu),
            ((ref.log_prob_micro_batch_size_per_gpu, ref.log_prob_micro_batch_size), bool(ref.log_prob_use_dynamic_bsz),
             ref.log_prob_max_token_len_per_gpu)]


def sizes_given(cfg: VerlView) -> Iterable[tuple[str, str, Any]]:
    """(pass, key, value) of each micro-batch size the config sets."""
    for (name, keys, _, _), (sizes, _, _) in zip(PASSES, _values(cfg)):
        yield from ((name, key, v) for key, v in zip(keys, sizes) if v is not None)


def switches(cfg: VerlView) -> list[tuple[str, bool]]:
    """(key, on) of each pass's dynamic batching switch."""
    return [(dyn, on) for (_, _, dyn, _), (_, on, _) in zip(PASSES, _values(cfg))]


def ignored(info: dict[str, Any], cfg: VerlView) -> Iterable[tuple[dict[str, Any], str, str, Any]]:
    """(the user's micro-batch, its pass's dynamic batching switch, token budget key, its value) for each micro-batch
    that dynamic batching makes ineffective in this config."""
    for m in info.get("micro") or ():
        for (name, _, dyn, budget), (_, on, tokens) in zip(PASSES, _values(cfg)):
            if name == m["pass"] and on:
                yield m, dyn, budget, tokens
