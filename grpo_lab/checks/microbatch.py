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

    info = settle(verl, layers)      # changes verl in place; lab.micro_batch = info for the rule
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from grpo_lab.verl_keys import A, get, put

if TYPE_CHECKING:
    from grpo_lab.cli.provenance import Layers

# (pass, its micro-batch keys (per GPU, and verl's deprecated global form), its dynamic batching switch, token budget)
PASSES: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("actor update", (A + "actor.ppo_micro_batch_size_per_gpu", A + "actor.ppo_micro_batch_size"),
     A + "actor.use_dynamic_bsz", A + "actor.ppo_max_token_len_per_gpu"),
    ("rollout log-prob", (A + "rollout.log_prob_micro_batch_size_per_gpu", A + "rollout.log_prob_micro_batch_size"),
     A + "rollout.log_prob_use_dynamic_bsz", A + "rollout.log_prob_max_token_len_per_gpu"),
    ("reference log-prob", (A + "ref.log_prob_micro_batch_size_per_gpu", A + "ref.log_prob_micro_batch_size"),
     A + "ref.log_prob_use_dynamic_bsz", A + "ref.log_prob_max_token_len_per_gpu"),
)
DEFAULTS_FILE = "conf/config.yaml"  # grpo-lab's own defaults; every other layer is the user's choice


def _users(set_by: str | None) -> bool:
    """Whether a layer of the user's set it: the command line, the environment, a conf/ file other than the
    defaults (an experiment file of theirs); not conf/config.yaml, not verl."""
    return bool(set_by) and not set_by.startswith((DEFAULTS_FILE, "verl", "grpo_lab/"))


def _set_by(layers: "Layers", key: str) -> str | None:
    found = layers.set_by(key)
    return found[1] if found else None


def settle(verl: dict[str, Any], layers: "Layers") -> dict[str, Any]:
    """Turn grpo-lab's dynamic batching default off where the user's micro-batch would be ignored (in place).

    Returns what the rule micro_batch_explicit reports: {"micro": [{pass, key, value, set_by}], "turned_off": [{key,
    set_by}], "kept_on": [{key, set_by}]} ({} when the user gave no micro-batch size)."""
    micro = []
    for name, keys, _, _ in PASSES:
        for key in keys:
            value, by = get(verl, key), _set_by(layers, key)
            if value is not None and _users(by):
                micro.append({"pass": name, "key": key, "value": value, "set_by": by})
    if not micro:
        return {}
    switches = [(dyn, bool(get(verl, dyn, False)), _set_by(layers, dyn)) for _, _, dyn, _ in PASSES]
    kept = [{"key": dyn, "set_by": by} for dyn, on, by in switches if on and _users(by)]
    off = []
    if not kept:  # no use_dynamic_bsz=true of the user's: their micro-batch wins over our default
        for dyn, on, by in switches:
            if on:
                put(verl, dyn, False)
                off.append({"key": dyn, "set_by": by})
    return {"micro": micro, "turned_off": off, "kept_on": kept}


def ignored(info: dict[str, Any], verl_get) -> Iterable[tuple[dict[str, Any], str, str]]:
    """(the user's micro-batch, its pass's dynamic batching switch, token budget key) for each micro-batch that dynamic
    batching makes ineffective in this config (`verl_get(key)` reads it)."""
    for m in info.get("micro") or ():
        for name, _, dyn, budget in PASSES:
            if name == m["pass"] and verl_get(dyn):
                yield m, dyn, budget
