"""Keys verl 0.9.1's config takes and its default V1 trainer never reads: a value set there changes nothing, without a
word. Each is refused with the key verl reads instead (or verl's own default, when nothing reads it), as an override
appended to the command. Where verl shows it: each group's comment below, and docs/verl_unread_keys.md.

A prefix covers the keys under it (custom_reward_function.path -> reward.custom_reward_function.path); the first
entry that matches a key is its entry. A key at verl's default, or already equal to the key verl reads, is left alone.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

from grpo_lab.cli.overrides import quote
from grpo_lab.checks.rules import ALT, Ctx, Problem, error, note, rule, thaw

# verl 0.9.1's trainers read reward.* (verl/trainer/ppo/reward.py, verl/workers/config/reward.py); only the fully-async
# entrypoint moves the older top-level keys there (verl/experimental/fully_async_policy/fully_async_main.py calls
# migrate_legacy_reward_impl, verl/experimental/reward_loop/reward_loop.py, whose mapping the entries follow)
LEGACY = ("verl 0.9.1's trainers read reward.* (verl/trainer/ppo/reward.py); only its fully-async entrypoint moves "
          "this older top-level key there (verl/experimental/fully_async_policy/fully_async_main.py, "
          "migrate_legacy_reward_impl)")
# the keys that only the deprecated legacy trainer reads (trainer.use_v1=false: verl/trainer/ppo/ray_trainer.py)
V1 = "only the deprecated legacy trainer reads it (verl/trainer/ppo/ray_trainer.py, trainer.use_v1=false)"

# (key or prefix verl never reads, the key it reads instead or None, where verl shows it)
UNREAD: tuple[tuple[str, str | None, str], ...] = (
    ("custom_reward_function", "reward.custom_reward_function", LEGACY),
    ("sandbox_fusion", "reward.sandbox_fusion", LEGACY),
    ("reward_model.num_workers", "reward.num_workers", LEGACY),
    ("reward_model.reward_manager", "reward.reward_manager.name", LEGACY),
    ("reward_model.reward_loop_source", "reward.reward_manager.source", LEGACY),
    ("reward_model.reward_loop_module_path", "reward.reward_manager.module.path", LEGACY),
    ("reward_model.reward_loop_class_name", "reward.reward_manager.module.name", LEGACY),
    ("reward_model.enable", "reward.reward_model.enable", LEGACY),
    ("reward_model.enable_resource_pool", "reward.reward_model.enable_resource_pool", LEGACY),
    ("reward_model.n_gpus_per_node", "reward.reward_model.n_gpus_per_node", LEGACY),
    ("reward_model.nnodes", "reward.reward_model.nnodes", LEGACY),
    ("reward_model.model.path", "reward.reward_model.model_path", LEGACY),
    ("reward_model.reward_kwargs", "reward.reward_kwargs", LEGACY),
    ("reward_model.rollout", "reward.reward_model.rollout", LEGACY),
    ("reward_model", None, LEGACY + "; the migration has no place for this one"),
    # declared (verl/workers/config/actor.py, critic.py); the engines clip with the optimizer's clip_grad
    # (verl/workers/engine/fsdp/transformer_impl.py optimizer_step)
    ("actor_rollout_ref.actor.grad_clip", "actor_rollout_ref.actor.optim.clip_grad",
     "verl/workers/config/actor.py declares it, and verl's engines clip with the optimizer's clip_grad "
     "(verl/workers/engine/fsdp/transformer_impl.py)"),
    ("critic.grad_clip", "critic.optim.clip_grad",
     "verl/workers/config/critic.py declares it, and verl's engines clip with the optimizer's clip_grad "
     "(verl/workers/engine/fsdp/transformer_impl.py)"),
    # "Deprecated and ignored. Use global_profiler.steps." (verl/trainer/config/ppo_trainer.yaml, actor/actor.yaml,
    # rollout/rollout.yaml, ref/ref.yaml, critic/critic.yaml; verl/utils/profiler/precision_debugger_profile.py)
    *((f"{part}.precision_debugger.steps", "global_profiler.steps",
       "verl's config says 'Deprecated and ignored. Use global_profiler.steps.' "
       "(verl/utils/profiler/precision_debugger_profile.py)")
      for part in ("global_profiler.global_tool_config", "actor_rollout_ref.actor.profiler.tool_config",
                   "actor_rollout_ref.ref.profiler.tool_config", "actor_rollout_ref.rollout.profiler.tool_config",
                   "critic.profiler.tool_config")),
    # declared in verl's config and its dataclasses; no code of verl 0.9.1 reads them
    ("actor_rollout_ref.rollout.over_sample_rate", None,
     "verl/workers/config/rollout.py declares it and no code of verl 0.9.1 reads it"),
    ("actor_rollout_ref.rollout.multi_stage_wake_up", None,
     "verl/workers/config/rollout.py declares it and no code of verl 0.9.1 reads it"),
    ("actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts", None,
     "verl/workers/config/rollout.py declares it and no code of verl 0.9.1 reads it"),
    ("actor_rollout_ref.actor.freeze_vision_tower", None,
     "verl/workers/config/actor.py declares it and no code of verl 0.9.1 reads it"),
    ("actor_rollout_ref.nccl_timeout", None,
     "verl/trainer/config/ppo_trainer.yaml sets it and no code of verl 0.9.1 reads it (the engine workers start "
     "their process group with timeout_second=None: verl/workers/engine_workers.py)"),
    ("data.return_raw_input_ids", None,
     "verl/trainer/config/data/legacy_data.yaml sets it and no code of verl 0.9.1 reads it"),
    # V1 (the default trainer) always balances the step (verl/trainer/ppo/v1/trainer_base.py _balance_batch), builds
    # its worker groups without the register-center timeout and has no ESI checkpoint timing
    ("trainer.balance_batch", None, V1 + "; the V1 trainer always balances each step "
                                         "(verl/trainer/ppo/v1/trainer_base.py _balance_batch)"),
    ("trainer.esi_redundant_time", None, V1),
    ("trainer.ray_wait_register_center_timeout", None, V1),
)

_MISSING = object()


def _at(d: Any, dotted: str) -> Any:
    """d's value at 'a.b' (None kept), or _MISSING."""
    for part in dotted.split("."):
        if not isinstance(d, Mapping) or part not in d:
            return _MISSING
        d = d[part]
    return d


def _leaves(v: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(v, Mapping) and v:
        for k, x in v.items():
            yield from _leaves(x, f"{path}.{k}")
    else:
        yield path, v


def _shown(v: Any) -> str:
    return "null" if v is None or v is _MISSING else quote(thaw(v))


def unread_values(c: Ctx, defaults: Mapping[str, Any]) -> Iterator[tuple[str, Any, str | None, str]]:
    """(key, value, the key verl reads or None, where verl shows it) of each key of UNREAD set to something verl's
    default is not, and that the key verl reads does not already hold."""
    seen: set[str] = set()
    v1 = bool(c.get("trainer.use_v1", True))
    for prefix, reads, why in UNREAD:
        value = _at(c.verl, prefix)
        if value is _MISSING or (why.startswith(V1) and not v1):
            continue
        for key, v in _leaves(value, prefix):
            default = _at(defaults, key)
            if key in seen or thaw(v) == (None if default is _MISSING else thaw(default)):
                continue
            seen.add(key)
            target = reads + key[len(prefix):] if reads else None
            if target is None or thaw(_at(c.verl, target)) != thaw(v):
                yield key, v, target, why


@rule("key_unread", kind="setup", phase="compose")
def key_unread(c: Ctx) -> Iterable[Problem]:
    """A key verl 0.9.1 takes and never reads (UNREAD): refused with the key it reads, or its default."""
    from grpo_lab.verl_schema import schema

    defaults = schema().defaults
    if not defaults:
        yield note("keys verl 0.9.1 never reads not checked: verl's config defaults could not be read")
        return
    for key, v, target, why in unread_values(c, defaults):
        default = _at(defaults, key)
        if target is not None:
            now = _at(c.verl, target)
            effect = f"verl reads {target} instead, which is {_shown(now)} here: the run would go with that"
            fix = f"{'+' if now is _MISSING else ''}{target}={_shown(v)}"
        else:
            effect = f"The run would go as with verl's default {_shown(default)}"
            fix = f"~{key}" if default is _MISSING else f"{key}={_shown(default)}"
        if why.startswith(V1):
            fix = ALT.join([fix, "trainer.use_v1=false"])
        yield error(f"{key}={_shown(v)} is a key verl 0.9.1 never reads: {why}. {effect}, without a word", fix)
