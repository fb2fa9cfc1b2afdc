"""The job's settings as verl 0.9.1 reads them: one typed view of the composed config (its values read here once,
with the composed values as the only defaults), the batch arithmetic, and the numbers verl needs.

What each value means: docs/memory_plan.md (Settings) and docs/preflight.md (the batch arithmetic)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from grpo_lab import facts
from grpo_lab.labconf import Lab
from grpo_lab.memory.memplan_arch import Settings
from grpo_lab.verl_keys import A
from grpo_lab.verl_keys import get as schema_get

KV_PIN = A + "rollout.engine_kwargs.vllm.kv_cache_memory_bytes"  # vLLM's KV cache in bytes (side by side pins it)

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

class Keys:
    """verl's composed config flattened once: each value, and each section, by its dotted key."""

    def __init__(self, verl: Mapping[str, Any]) -> None:
        self.flat: dict[str, Any] = {}
        todo: list[tuple[str, Mapping[str, Any]]] = [("", verl)]
        while todo:
            prefix, node = todo.pop()
            for k, v in node.items():
                self.flat[prefix + k] = v
                if isinstance(v, Mapping):
                    todo.append((f"{prefix}{k}.", v))

    def __call__(self, key: str, default: Any = None) -> Any:
        """The value at `key`; `default` where it is absent or null."""
        v = self.flat.get(key)
        return default if v is None else v


def keys_of(verl: Mapping[str, Any] | Keys) -> Keys:
    return verl if isinstance(verl, Keys) else Keys(verl)


def is_kind(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind is int else isinstance(value, (int, float))


def wrong_types(verl: Mapping[str, Any] | Keys) -> Iterator[tuple[str, Any, Any, str, Any, str]]:
    """(key, value, verl's default, what it must be, fix value, why) of each number verl needs that is no number, or
    null where verl's own default is a number. A key that only follows one named already (the ref's log-prob
    micro-batch reads the rollout's) is not named again."""
    read = keys_of(verl)
    from grpo_lab.cli.knobs import followers
    from grpo_lab.verl_schema import schema

    named: dict[str, Any] = {}
    for key, kind, _, fix, why in NUMBERS:
        v = read(key)
        default = schema_get(schema().defaults, key)
        if v is None and default is None or is_kind(v, kind):
            continue
        if kind is int and isinstance(v, float) and v.is_integer():
            continue
        if any(key in followers().get(k, ()) and named[k] == v for k in named):
            continue
        named[key] = v
        yield key, v, default, "a whole number" if kind is int else "a number", fix, why



def settings_from_verl(verl: Mapping[str, Any] | Keys, lab: Lab) -> Settings:
    """The memory-relevant settings of a resolved verl config (plain dict) and the job's card and host (`lab`)."""
    read = keys_of(verl)
    n_gpus = int(read("trainer.n_gpus_per_node", 1)) * int(read("trainer.nnodes", 1))
    override = read(A + "model.override_config", {}) or {}
    entropy_coeff = read(A + "actor.entropy_coeff", 0) or 0
    use_kl = bool(read(A + "actor.use_kl_loss", False)) or bool(read("algorithm.use_kl_in_reward", False))
    max_model_len = read(A + "rollout.max_model_len")
    return Settings(
        n_gpus=max(1, n_gpus),
        card_gb=float(lab.hardware.gpu_memory_gb or 0),
        host_ram_gb=lab.hardware.host_ram_gb,
        fsdp_size=int(read(A + "actor.fsdp_config.fsdp_size", -1)),
        nnodes=max(1, int(read("trainer.nnodes", 1) or 1)),
        strategy=str(read(A + "actor.strategy", "fsdp") or "fsdp"),
        ref_model_dtype=str(read(A + "ref.fsdp_config.model_dtype", "fp32") or "bf16"),
        # verl 0.9.1: fsdp_config.ulysses_sequence_parallel_size; the deprecated actor key wins when above 1
        sp_size=max(int(read(A + "actor.ulysses_sequence_parallel_size", 1) or 1),
                    int(read(A + "actor.fsdp_config.ulysses_sequence_parallel_size", 1) or 1)),
        lora_rank=int(read(A + "model.lora_rank", 0) or 0),
        lora_targets=read(A + "model.target_modules", "all-linear"),
        param_offload=bool(read(A + "actor.fsdp_config.param_offload", False)),
        optimizer_offload=bool(read(A + "actor.fsdp_config.optimizer_offload", False)),
        model_dtype=str(read(A + "actor.fsdp_config.model_dtype", "fp32") or "fp32"),
        gradient_checkpointing=bool(read(A + "model.enable_gradient_checkpointing", True)),
        activation_offload=bool(read(A + "model.enable_activation_offload", False)),
        attn_implementation=str(override.get("attn_implementation", "flash_attention_2")),
        use_dynamic_bsz=bool(read(A + "actor.use_dynamic_bsz", False)),
        ppo_max_token_len_per_gpu=int(read(A + "actor.ppo_max_token_len_per_gpu", 16384)),
        ppo_micro_batch_size_per_gpu=_int_or_none(read(A + "actor.ppo_micro_batch_size_per_gpu")),
        entropy_in_update=bool(read(A + "actor.calculate_entropy", False)) or float(entropy_coeff) != 0.0,
        entropy_checkpointing=bool(read(A + "actor.entropy_checkpointing", False)),
        actor_entropy_chunking=bool(read(A + "actor.entropy_from_logits_with_chunking", False)),
        entropy_chunk_size=int(read(A + "actor.entropy_from_logits_chunk_size", 2048)),
        use_torch_compile=bool(read(A + "actor.use_torch_compile", True))
        and bool(read(A + "actor.fsdp_config.use_torch_compile", True)),
        use_fused_kernels=bool(read(A + "model.use_fused_kernels", False)),
        use_remove_padding=bool(read(A + "model.use_remove_padding", True)),
        max_prompt_length=int(read("data.max_prompt_length", 512)),
        max_response_length=int(read("data.max_response_length", 512)),
        log_prob_use_dynamic_bsz=bool(read(A + "rollout.log_prob_use_dynamic_bsz", False)),
        log_prob_max_token_len_per_gpu=int(read(A + "rollout.log_prob_max_token_len_per_gpu", 16384)),
        log_prob_micro_batch_size_per_gpu=_int_or_none(read(A + "rollout.log_prob_micro_batch_size_per_gpu")),
        ref_used=use_kl,
        ref_log_prob_use_dynamic_bsz=bool(read(A + "ref.log_prob_use_dynamic_bsz", False)),
        ref_log_prob_max_token_len_per_gpu=int(read(A + "ref.log_prob_max_token_len_per_gpu", 16384)),
        ref_log_prob_micro_batch_size_per_gpu=_int_or_none(read(A + "ref.log_prob_micro_batch_size_per_gpu")),
        ref_entropy_chunking=bool(read(A + "ref.entropy_from_logits_with_chunking", False)),
        ref_param_offload=bool(read(A + "ref.fsdp_config.param_offload", False)),
        rollout_engine=str(read(A + "rollout.name", "vllm")),
        gpu_memory_utilization=float(read(A + "rollout.gpu_memory_utilization", 0.5)),
        tp=int(read(A + "rollout.tensor_model_parallel_size", 1) or 1),
        rollout_dp=int(read(A + "rollout.data_parallel_size", 1) or 1),
        free_cache_engine=bool(read(A + "rollout.free_cache_engine", True)),
        enforce_eager=bool(read(A + "rollout.enforce_eager", False)),
        max_num_seqs=int(read(A + "rollout.max_num_seqs", 256)),
        max_num_batched_tokens=int(read(A + "rollout.max_num_batched_tokens", 8192)),
        enable_chunked_prefill=bool(read(A + "rollout.enable_chunked_prefill", True)),
        max_model_len=int(max_model_len) if max_model_len else None,
        layered_summon=bool(read(A + "rollout.layered_summon", False)),
        vllm_kv_cache_bytes=_positive_int(read(KV_PIN)),
        bucket_mb=int(read(A + "rollout.checkpoint_engine.update_weights_bucket_megabytes", 2048)),
        train_batch_size=int(read("data.train_batch_size", 128)),
        rollout_n=int(read(A + "rollout.n", 1)),
        ppo_mini_batch_size=int(read(A + "actor.ppo_mini_batch_size", 0) or 0),
        ppo_epochs=int(read(A + "actor.ppo_epochs", 1) or 1),
    )


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
    if isinstance(x, bool):
        return default
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str):
        try:
            return int(x.strip())
        except ValueError:
            return default
    return default


def sp_size(verl: Mapping[str, Any] | Keys) -> int:
    """Ulysses sequence-parallel size as verl 0.9.1 takes it: actor.fsdp_config.ulysses_sequence_parallel_size, unless
    the deprecated actor.ulysses_sequence_parallel_size is above 1 (FSDPActorConfig.__post_init__ copies it over)."""
    read = keys_of(verl)
    old = as_int(read(A + "actor.ulysses_sequence_parallel_size", 1), 1)
    new = as_int(read(A + "actor.fsdp_config.ulysses_sequence_parallel_size", 1), 1)
    return max(1, old if old > 1 else new)


def ref_used(verl: Mapping[str, Any] | Keys) -> bool:
    read = keys_of(verl)
    return bool(read(A + "actor.use_kl_loss", False)) or bool(read("algorithm.use_kl_in_reward", False))


def critic_used(verl: Mapping[str, Any] | Keys) -> bool:
    """verl 0.9.1's need_critic (verl/trainer/ppo/utils.py): critic.enable when set, else adv_estimator == gae."""
    read = keys_of(verl)
    enable = read("critic.enable")
    return bool(enable) if enable is not None else str(read("algorithm.adv_estimator", "gae")) == "gae"


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


def mode(verl: Mapping[str, Any] | Keys) -> Mode:
    read = keys_of(verl)
    return Mode(bool(read("trainer.use_v1", True)), bool(read(A + "actor.use_dynamic_bsz", False)))


def v1_padding(verl: Mapping[str, Any] | Keys, b: dict[str, Any]) -> dict[str, Any] | None:
    """What the V1 trainer adds to each step (Mode): the multiple it pads to and the no-op samples it adds."""
    read = keys_of(verl)
    traj, dp, n, mini = b["trajectories_per_step"], b["data_parallel_size"], b["rollout_n"], b["ppo_mini_batch_size"]
    if traj <= 0 or mini <= 0 or n <= 0:
        return None
    multiple = math.lcm(dp, mini * n)
    if critic_used(read):
        multiple = math.lcm(multiple, max(1, as_int(read("critic.ppo_mini_batch_size"), mini)) * n)
    padded = math.ceil(traj / multiple) * multiple
    return {"multiple": multiple, "padded_trajectories": padded, "samples": padded - traj,
            "fraction": round((padded - traj) / padded, 3), "updates_per_step": padded // (mini * n)}


def batch_facts(verl: Mapping[str, Any] | Keys) -> dict[str, Any]:
    read = keys_of(verl)
    per_node = as_int(read("trainer.n_gpus_per_node", 1), 1)
    nnodes = max(1, as_int(read("trainer.nnodes", 1), 1))
    n_gpus = max(1, per_node * nnodes)
    sp = sp_size(read)
    dp = max(1, n_gpus // sp)
    tb = as_int(read("data.train_batch_size", 0))
    n = as_int(read(A + "rollout.n", 1), 1)
    mini = as_int(read(A + "actor.ppo_mini_batch_size", 0))
    prompt = as_int(read("data.max_prompt_length", 0))
    resp = as_int(read("data.max_response_length", 0))
    tp = max(1, as_int(read(A + "rollout.tensor_model_parallel_size", 1), 1))
    rdp = max(1, as_int(read(A + "rollout.data_parallel_size", 1), 1))
    rpp = max(1, as_int(read(A + "rollout.pipeline_model_parallel_size", 1), 1))
    traj, mini_traj, replica = tb * n, mini * n, tp * rdp * rpp
    replicas = n_gpus // replica if replica else 0
    b = {
        "n_gpus": n_gpus, "n_gpus_per_node": per_node, "nnodes": nnodes, "sequence_parallel_size": sp,
        "data_parallel_size": dp, "train_batch_size": tb, "rollout_n": n, "ppo_mini_batch_size": mini,
        "ppo_epochs": as_int(read(A + "actor.ppo_epochs", 1), 1),
        "trajectories_per_step": traj, "mini_batch_trajectories": mini_traj,
        "updates_per_step": (tb // mini if mini > 0 and tb % mini == 0 else round(tb / mini, 3) if mini > 0 else None),
        "trajectories_per_gpu": (mini_traj // dp if mini_traj % dp == 0 else round(mini_traj / dp, 3)),
        "trajectories_per_gpu_per_step": (traj // dp if traj % dp == 0 else round(traj / dp, 3)),
        "sequence_length": prompt + resp, "rollout_replica_gpus": replica, "rollout_replicas": replicas,
        "trajectories_per_replica": math.ceil(traj / replicas) if replicas else None,
        "train_rows": None, "steps_per_epoch": None,
        "total_epochs": as_int(read("trainer.total_epochs", 1), 1),
        "total_training_steps": read("trainer.total_training_steps"),
    }
    b["padding"] = v1_padding(read, b) if mode(read).v1 else None
    rows = train_rows(read)
    if rows is not None:
        b["train_rows"] = rows
        if tb > 0:
            b["steps_per_epoch"] = rows // tb  # verl's train dataloader drops the last partial batch
            if b["total_training_steps"] is None:
                b["total_training_steps"] = b["steps_per_epoch"] * b["total_epochs"]
    return b


def train_rows(verl: Mapping[str, Any] | Keys) -> int | None:
    """The train files' rows, when each is a parquet file here; None otherwise (the rule data_files says why)."""
    read = keys_of(verl)
    files = facts.local_files(read("data.train_files"))
    if files is None or not all(os.path.isfile(f) and f.lower().endswith(".parquet") for f in files):
        return None
    try:
        return sum(facts.parquet_num_rows(f) for f in files)
    except (OSError, ValueError, ImportError):
        return None
