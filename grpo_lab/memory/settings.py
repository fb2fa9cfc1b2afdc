"""The job's settings as verl 0.9.1 reads them, from the typed view of its composed config
(grpo_lab/memory/verl_view.py): the memory-relevant settings, the batch arithmetic, and the trainer mode.

What each value means: docs/memory_plan.md (Settings) and docs/preflight.md (the batch arithmetic)."""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from grpo_lab import facts
from grpo_lab.cli.apply import Change
from grpo_lab.cli.knobs import KNOBS, SHORT_KEYS, followers, moved_with, short_key_targets
from grpo_lab.labconf import Lab
from grpo_lab.memory.memplan_arch import Settings
from grpo_lab.memory.verl_view import VerlView
from grpo_lab.verl_keys import A


def settings_from_verl(verl: Mapping[str, Any] | VerlView, lab: Lab) -> Settings:
    """The memory-relevant settings of a composed verl config and the job's card and host (`lab`)."""
    cfg = verl if isinstance(verl, VerlView) else VerlView.of(verl)
    actor, ref, rollout, model, data = cfg.actor, cfg.ref, cfg.rollout, cfg.model, cfg.data
    n_gpus = int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes)
    return Settings(
        n_gpus=max(1, n_gpus),
        card_gb=float(lab.hardware.gpu_memory_gb or 0),
        host_ram_gb=lab.hardware.host_ram_gb,
        fsdp_size=int(actor.fsdp_config.fsdp_size),
        nnodes=max(1, int(cfg.trainer.nnodes or 1)),
        strategy=str(actor.strategy),
        ref_model_dtype=str(ref.fsdp_config.model_dtype or "bf16"),  # null: verl's forward-only bf16
        sp_size=sp_size(cfg),
        lora_rank=int(model.lora_rank or 0),
        lora_targets=model.target_modules,
        param_offload=bool(actor.fsdp_config.param_offload),
        optimizer_offload=bool(actor.fsdp_config.optimizer_offload),
        model_dtype=str(actor.fsdp_config.model_dtype),
        gradient_checkpointing=bool(model.enable_gradient_checkpointing),
        activation_offload=bool(model.enable_activation_offload),
        # verl/workers/config/model.py HFModelConfig: override_config's own attn_implementation
        attn_implementation=str(model.override_config.get("attn_implementation", "flash_attention_2")),
        use_dynamic_bsz=bool(actor.use_dynamic_bsz),
        ppo_max_token_len_per_gpu=int(actor.ppo_max_token_len_per_gpu),
        ppo_micro_batch_size_per_gpu=_int_or_none(actor.ppo_micro_batch_size_per_gpu),
        entropy_in_update=bool(actor.calculate_entropy) or float(actor.entropy_coeff or 0) != 0.0,
        entropy_checkpointing=bool(actor.entropy_checkpointing),
        actor_entropy_chunking=bool(actor.entropy_from_logits_with_chunking),
        entropy_chunk_size=int(actor.entropy_from_logits_chunk_size),
        use_torch_compile=bool(actor.use_torch_compile) and bool(actor.fsdp_config.use_torch_compile),
        use_fused_kernels=bool(model.use_fused_kernels),
        use_remove_padding=bool(model.use_remove_padding),
        max_prompt_length=int(data.max_prompt_length),
        max_response_length=int(data.max_response_length),
        log_prob_use_dynamic_bsz=bool(rollout.log_prob_use_dynamic_bsz),
        log_prob_max_token_len_per_gpu=int(rollout.log_prob_max_token_len_per_gpu),
        log_prob_micro_batch_size_per_gpu=_int_or_none(rollout.log_prob_micro_batch_size_per_gpu),
        ref_used=ref_used(cfg),
        ref_log_prob_use_dynamic_bsz=bool(ref.log_prob_use_dynamic_bsz),
        ref_log_prob_max_token_len_per_gpu=int(ref.log_prob_max_token_len_per_gpu),
        ref_log_prob_micro_batch_size_per_gpu=_int_or_none(ref.log_prob_micro_batch_size_per_gpu),
        ref_entropy_chunking=bool(ref.entropy_from_logits_with_chunking),
        ref_param_offload=bool(ref.fsdp_config.param_offload),
        rollout_engine=str(rollout.name),
        gpu_memory_utilization=float(rollout.gpu_memory_utilization),
        tp=int(rollout.tensor_model_parallel_size or 1),
        rollout_dp=int(rollout.data_parallel_size or 1),
        free_cache_engine=bool(rollout.free_cache_engine),
        enforce_eager=bool(rollout.enforce_eager),
        max_num_seqs=int(rollout.max_num_seqs),
        max_num_batched_tokens=int(rollout.max_num_batched_tokens),
        enable_chunked_prefill=bool(rollout.enable_chunked_prefill),
        max_model_len=int(rollout.max_model_len) if rollout.max_model_len else None,
        layered_summon=bool(rollout.layered_summon),
        vllm_kv_cache_bytes=_positive_int(kv_cache_memory_bytes(cfg)),
        bucket_mb=int(rollout.checkpoint_engine.update_weights_bucket_megabytes),
        train_batch_size=int(data.train_batch_size),
        rollout_n=int(rollout.n),
        ppo_mini_batch_size=int(actor.ppo_mini_batch_size or 0),
        ppo_epochs=int(actor.ppo_epochs or 1),
    )


# the Settings field that a verl key alone sets, as settings_from_verl reads it (tests/test_settings.py holds each
# against it): what a change of the key does to the plans
FIELD_OF_KEY = {A + k: f for k, f in {
    "rollout.max_model_len": "max_model_len", "rollout.free_cache_engine": "free_cache_engine",
    "rollout.checkpoint_engine.update_weights_bucket_megabytes": "bucket_mb",
    "model.enable_gradient_checkpointing": "gradient_checkpointing",
    "actor.ppo_max_token_len_per_gpu": "ppo_max_token_len_per_gpu",
    "rollout.log_prob_max_token_len_per_gpu": "log_prob_max_token_len_per_gpu",
    "ref.log_prob_max_token_len_per_gpu": "ref_log_prob_max_token_len_per_gpu",
    "actor.ppo_micro_batch_size_per_gpu": "ppo_micro_batch_size_per_gpu",
    "rollout.log_prob_micro_batch_size_per_gpu": "log_prob_micro_batch_size_per_gpu",
    "ref.log_prob_micro_batch_size_per_gpu": "ref_log_prob_micro_batch_size_per_gpu",
    "actor.fsdp_config.optimizer_offload": "optimizer_offload", "actor.fsdp_config.param_offload": "param_offload",
    "rollout.gpu_memory_utilization": "gpu_memory_utilization", "rollout.tensor_model_parallel_size": "tp",
    "actor.entropy_checkpointing": "entropy_checkpointing",
    "actor.entropy_from_logits_with_chunking": "actor_entropy_chunking", "rollout.layered_summon": "layered_summon",
    "model.use_fused_kernels": "use_fused_kernels", "model.use_remove_padding": "use_remove_padding",
    "model.lora_rank": "lora_rank", "model.target_modules": "lora_targets", "actor.strategy": "strategy",
}.items()}


_UNPLANNED = object()  # the value of a key no Settings field holds


def settings_after(s: Settings, changes: Iterable[Change] | Mapping[str, Any],
                   apart: Mapping[str, Iterable[str]] | None = None) -> Settings:
    """The settings after the changes, for the plans, as apply_overrides changes the config: each key's field (a short
    key's through the verl keys it sets), and the fields of keys that follow it (`${key}`) and still hold its value,
    unless the config sets them on their own (`apart`: lab.set_apart); a key that moves no planned setting
    (lora_alpha, load_format) leaves them."""
    new: dict[str, Any] = {}
    set_apart = {k for keys in (apart or {}).values() for k in keys}
    touched, follow = set(set_apart), _followers()
    pairs = changes.items() if isinstance(changes, Mapping) else ((c.key, c.value) for c in changes)
    planned = lambda k: getattr(s, FIELD_OF_KEY[k]) if k in FIELD_OF_KEY else _UNPLANNED  # noqa: E731
    for key, value in pairs:
        targets = [k for k in follow.get(key, ()) if k not in set_apart] if key in SHORT_KEYS else [key]
        touched.update(targets)
        for t in (t for t in targets if t in FIELD_OF_KEY):
            moved = [t, *moved_with(t, planned(t), planned, touched)]
            touched.update(moved)
            new.update((FIELD_OF_KEY[k], _as_field(planned(k), value)) for k in moved)
    return replace(s, **new)


def one_sequence(s: Settings) -> dict[str, int]:
    """The dynamic token budgets below one sequence of prompt + response (over Ulysses SP), raised to one: verl
    asserts it (rule token_budget). {verl key: value}; {} when all hold one."""
    need = math.ceil(s.seq_len / max(1, s.sp_size))
    passes = (("ppo_max_token_len_per_gpu", "actor.", s.use_dynamic_bsz),
              ("log_prob_max_token_len_per_gpu", "rollout.", s.log_prob_use_dynamic_bsz),
              ("ref_log_prob_max_token_len_per_gpu", "ref.", s.ref_used and s.ref_log_prob_use_dynamic_bsz))
    return {A + pre + f.removeprefix("ref_"): need for f, pre, on in passes if on and getattr(s, f) < need}


@functools.cache
def _followers() -> dict[str, tuple[str, ...]]:
    """key -> the keys that follow it (grpo_lab/cli/knobs.py followers), a short key -> the verl keys it sets."""
    return followers() | {k: short_key_targets(k) for k in SHORT_KEYS}


def spelled(values: Mapping[str, Any], cfg: Any, reason: str = "") -> list[Change]:
    """Values as the changes a user types: a verl key by its short key where that feeds it in the composed config
    (cfg: the unresolved DictConfig; None: wherever the short key sets that key alone), else by verl's key."""
    return [Change(_typed_key(k, cfg), v, reason=reason) for k, v in values.items()]


def _typed_key(verl_key: str, cfg: Any) -> str:
    short = _short_keys().get(verl_key)
    if short is None or cfg is None:
        return short or verl_key
    try:
        from omegaconf import OmegaConf

        parent, leaf = verl_key.rsplit(".", 1)
        raw = OmegaConf.to_container(OmegaConf.select(cfg, parent), resolve=False)[leaf]
    except Exception:
        return verl_key
    return short if raw == "${" + short + "}" else verl_key


@functools.cache
def _short_keys() -> dict[str, str]:
    """verl key -> the short key that sets it alone (grpo_lab/cli/knobs.py)."""
    return {k.verl_key: k.key for k in KNOBS if short_key_targets(k.key) == (k.verl_key,)}


def _as_field(current: Any, value: Any) -> Any:
    """A change's value as its Settings field holds it (settings_from_verl's conversions); an unset size, as given."""
    for kind in (bool, int, float, str):
        if isinstance(current, kind) and value is not None:
            return kind(value)
    return value


def kv_cache_memory_bytes(cfg: VerlView) -> Any:
    """rollout.engine_kwargs.vllm.kv_cache_memory_bytes: vLLM's KV cache in bytes, set (side by side pins it)."""
    vllm = cfg.rollout.engine_kwargs.get("vllm")
    return vllm.get("kv_cache_memory_bytes") if isinstance(vllm, Mapping) else None


def _int_or_none(v: Any) -> int | None:
    """A size that may be unset (null); any other value that is no number raises, as int() does."""
    return None if v is None else int(v)


def _positive_int(v: Any) -> int | None:
    try:
        n = int(float(v))
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def as_int(x: Any, default: int = 0) -> int:
    """An integer config value; `default` when it is not one (values.* rules name the bad ones)."""
    if isinstance(x, int) and not isinstance(x, bool) or isinstance(x, float) and x.is_integer():
        return int(x)
    with contextlib.suppress(ValueError):
        if isinstance(x, str):
            return int(x.strip())
    return default


def sp_size(cfg: VerlView) -> int:
    """Ulysses sequence-parallel size as verl 0.9.1 takes it: actor.fsdp_config.ulysses_sequence_parallel_size, unless
    the deprecated actor.ulysses_sequence_parallel_size is above 1 (FSDPActorConfig.__post_init__ copies it over)."""
    old = as_int(cfg.actor.ulysses_sequence_parallel_size, 1)
    new = as_int(cfg.actor.fsdp_config.ulysses_sequence_parallel_size, 1)
    return max(1, old if old > 1 else new)


def ref_used(cfg: VerlView) -> bool:
    return bool(cfg.actor.use_kl_loss) or bool(cfg.algorithm.use_kl_in_reward)


def critic_used(cfg: VerlView) -> bool:
    """verl 0.9.1's need_critic (verl/trainer/ppo/utils.py): critic.enable when set, else adv_estimator == gae."""
    enable = cfg.critic.enable
    return bool(enable) if enable is not None else str(cfg.algorithm.adv_estimator) == "gae"


# ---- the trainer mode: which batch shapes verl 0.9.1 fails on, and which it only pads ---------------------------

@dataclass(frozen=True)
class Mode:
    """verl 0.9.1's trainer and batching mode, the one thing the batch rules' verdicts turn on.

    v1 (trainer.use_v1, verl's default true): the V1 trainer pads every step's batch with synthetic no-op samples
    (tag is_padding, a 128-token sequence with zero response mask and reward, a uid of their own) up to a multiple of
    lcm(actor data-parallel size, ppo_mini_batch_size x n) (and the critic's mini-batch x n when a critic is used):
    verl/trainer/ppo/v1/trainer_base.py PPOTrainer._balance_batch -> _get_required_batch_multiple,
    verl/trainer/ppo/padding_utils.py upsample_batch_to_divisible_size. A step that does not split over the GPUs or
    into whole mini-batches then runs, its compute partly spent on padding. The legacy trainer (trainer.use_v1=false,
    deprecated: verl/trainer/main_ppo_v0.py) pads nothing: its _balance_batch partitions the step in equal parts over
    the data-parallel ranks (verl/utils/seqlen_balancing.py karmarkar_karp asserts it) and each rank's share must be
    whole mini-batches (verl/workers/engine_workers.py TrainingWorker.train_mini_batch -> tu.make_iterator,
    verl/utils/tensordict_utils.py, asserts it).
    dyn (actor.use_dynamic_bsz): without it, verl's validate_config (verl/utils/config.py; grpo-lab's launch calls it
    before run_ppo, as verl's main_ppo does) asserts the step splits over every GPU and ActorConfig.validate
    (verl/workers/config/actor.py) raises for a train batch below the mini-batch, in both trainers."""

    v1: bool
    dyn: bool

    @property
    def name(self) -> str:
        trainer = "verl's V1 trainer" if self.v1 else "verl's legacy trainer (trainer.use_v1=false)"
        return trainer + (" with dynamic batching" if self.dyn else
                          " without dynamic batching (actor.use_dynamic_bsz=false)")


def mode(cfg: VerlView) -> Mode:
    return Mode(bool(cfg.trainer.use_v1), bool(cfg.actor.use_dynamic_bsz))


def v1_padding(cfg: VerlView, b: dict[str, Any]) -> dict[str, Any] | None:
    """What the V1 trainer adds to each step (Mode): the multiple it pads to and the no-op samples it adds."""
    traj, dp, n, mini = b["trajectories_per_step"], b["data_parallel_size"], b["rollout_n"], b["ppo_mini_batch_size"]
    if traj <= 0 or mini <= 0 or n <= 0:
        return None
    multiple = math.lcm(dp, mini * n)
    if critic_used(cfg):
        multiple = math.lcm(multiple, max(1, as_int(cfg.critic.ppo_mini_batch_size, mini)) * n)
    padded = math.ceil(traj / multiple) * multiple
    return {"multiple": multiple, "padded_trajectories": padded, "samples": padded - traj,
            "fraction": round((padded - traj) / padded, 3), "updates_per_step": padded // (mini * n)}


def batch_facts(cfg: VerlView) -> dict[str, Any]:
    """The batch arithmetic of the job (docs/preflight.md); a value that is no whole number counts as 0 (sizes) or 1
    (counts), and rules.values names it."""
    trainer, rollout = cfg.trainer, cfg.rollout
    per_node = as_int(trainer.n_gpus_per_node, 1)
    nnodes = max(1, as_int(trainer.nnodes, 1))
    n_gpus = max(1, per_node * nnodes)
    sp = sp_size(cfg)
    dp = max(1, n_gpus // sp)
    tb = as_int(cfg.data.train_batch_size)
    n = as_int(rollout.n, 1)
    mini = as_int(cfg.actor.ppo_mini_batch_size)
    prompt = as_int(cfg.data.max_prompt_length)
    resp = as_int(cfg.data.max_response_length)
    replica = math.prod(max(1, as_int(size, 1)) for size in (  # a rollout replica's GPUs: TP x DP x PP
        rollout.tensor_model_parallel_size, rollout.data_parallel_size, rollout.pipeline_model_parallel_size))
    traj, mini_traj, replicas = tb * n, mini * n, n_gpus // replica
    b = {
        "n_gpus": n_gpus, "n_gpus_per_node": per_node, "nnodes": nnodes, "sequence_parallel_size": sp,
        "data_parallel_size": dp, "train_batch_size": tb, "rollout_n": n, "ppo_mini_batch_size": mini,
        "ppo_epochs": as_int(cfg.actor.ppo_epochs, 1),
        "trajectories_per_step": traj, "mini_batch_trajectories": mini_traj,
        "updates_per_step": (tb // mini if mini > 0 and tb % mini == 0 else round(tb / mini, 3) if mini > 0 else None),
        "trajectories_per_gpu": (mini_traj // dp if mini_traj % dp == 0 else round(mini_traj / dp, 3)),
        "trajectories_per_gpu_per_step": (traj // dp if traj % dp == 0 else round(traj / dp, 3)),
        "sequence_length": prompt + resp, "rollout_replica_gpus": replica, "rollout_replicas": replicas,
        "trajectories_per_replica": math.ceil(traj / replicas) if replicas else None,
        "train_rows": None, "steps_per_epoch": None,
        "total_epochs": as_int(trainer.total_epochs, 1),
        "total_training_steps": trainer.total_training_steps,
    }
    b["padding"] = v1_padding(cfg, b) if mode(cfg).v1 else None
    rows = train_rows(cfg)
    if rows is not None:
        b["train_rows"] = rows
        if tb > 0:
            b["steps_per_epoch"] = rows // tb  # verl's train dataloader drops the last partial batch
            if b["total_training_steps"] is None:
                b["total_training_steps"] = b["steps_per_epoch"] * b["total_epochs"]
    return b


def train_rows(cfg: VerlView) -> int | None:
    """The train files' rows, when each is a parquet file here; None otherwise (the rule data_files says why)."""
    files = facts.local_files(cfg.data.train_files)
    if files is None or not all(os.path.isfile(f) and f.lower().endswith(".parquet") for f in files):
        return None
    try:
        return sum(facts.parquet_num_rows(f) for f in files)
    except (OSError, ValueError, ImportError):
        return None
