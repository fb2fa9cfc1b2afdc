"""A user's micro-batch size wins over grpo-lab's dynamic batching default, or the plan says loudly that it is ignored.

conf/config.yaml turns verl's dynamic batching on for the actor update and both log-prob passes (the official script
does), and then verl packs micro-batches by tokens (ppo_max_token_len_per_gpu, log_prob_max_token_len_per_gpu): a
micro-batch size has no effect. A script written for verl's own default (dynamic batching off) that sets
`actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2` would silently get token budgets instead. So:

  - a micro-batch size the user gave (command line, environment, or a file of theirs under conf/ other than
    conf/config.yaml; for the actor update, the rollout's or the reference's log-prob pass) turns grpo-lab's dynamic
    batching default off, and the plan's notes say so (rule micro_batch_explicit). All three passes go together:
    verl 0.9.1's engine worker asserts actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz
    (workers/engine_workers.py), and the preflight refuses a reference pass that batches differently
    (rule dynamic_bsz_mismatch);
  - when the user also set a use_dynamic_bsz=true themselves, nothing is changed and the plan warns that their
    micro-batch is ignored, and why.

Who set a value is grpo_lab/cli/provenance.py's answer (the same as plan.json's changed_defaults "set_by").

    info = settle(verl, layers)      # grpo_lab/launch/prepare.py, in place; lab.micro_batch = info for the rule
"""

from __future__ import annotations

from typing import Any, Iterable

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


def ignored(info: dict[str, Any], verl_get) -> Iterable[tuple[dict[str, Any], str, str]]:
    """(the user's micro-batch, its pass's dynamic batching switch, token budget key) for each micro-batch that dynamic
    batching makes ineffective in this config (`verl_get(key)` reads it)."""
    for m in info.get("micro") or ():
        for name, _, dyn, budget in PASSES:
            if name == m["pass"] and verl_get(dyn):
                yield m, dyn, budget
