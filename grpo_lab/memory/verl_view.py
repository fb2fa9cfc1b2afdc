"""A typed view of the composed verl config, read once per Run: verl 0.9.1's sections and field names, so that reads
look like verl's own (`cfg.rollout.n`, `cfg.actor.fsdp_config.param_offload`, `cfg.data.max_prompt_length`).

A value is the composed one (null stays None); a key the composed config lacks has verl's own default (its schema,
grpo_lab/verl_schema), or the default of verl's dataclass for the few keys verl's YAML leaves out. Values are not
converted: a number given as text stays text (rules.values names it). Mapping sections are read-only mappings, lists
tuples. The few reads by dotted key that tables need (NUMBERS, the micro-batch passes) go through `VerlView.at`."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from grpo_lab.verl_keys import A, freeze
from grpo_lab.verl_keys import get as schema_get

EMPTY: Mapping[str, Any] = MappingProxyType({})
_NO = object()  # a key the mapping does not have


@dataclass(frozen=True, kw_only=True)
class FSDPConfigView:  # verl/workers/config/engine.py FSDPEngineConfig
    fsdp_size: int
    param_offload: bool
    optimizer_offload: bool
    model_dtype: str
    ulysses_sequence_parallel_size: int
    use_torch_compile: bool


@dataclass(frozen=True, kw_only=True)
class OptimView:  # verl/workers/config/optimizer.py FSDPOptimizerConfig
    lr: float


@dataclass(frozen=True, kw_only=True)
class ActorView:  # verl/workers/config/actor.py FSDPActorConfig
    strategy: str
    ppo_mini_batch_size: int
    ppo_micro_batch_size: int | None
    ppo_micro_batch_size_per_gpu: int | None
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    ppo_epochs: int
    use_kl_loss: bool
    kl_loss_coef: float
    entropy_coeff: float
    calculate_entropy: bool
    calculate_sum_pi_squared: bool
    entropy_checkpointing: bool
    entropy_from_logits_with_chunking: bool
    entropy_from_logits_chunk_size: int
    use_torch_compile: bool
    ulysses_sequence_parallel_size: int
    optim: OptimView
    fsdp_config: FSDPConfigView


@dataclass(frozen=True, kw_only=True)
class RefView:  # verl/trainer/config/ref/dp_ref.yaml
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: int | None
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    entropy_from_logits_with_chunking: bool
    fsdp_config: FSDPConfigView


@dataclass(frozen=True, kw_only=True)
class AgentLoopView:  # verl/workers/config/rollout.py AgentLoopConfig
    num_workers: int


@dataclass(frozen=True, kw_only=True)
class SamplingView:  # verl/workers/config/rollout.py SamplingConfig
    n: int


@dataclass(frozen=True, kw_only=True)
class CheckpointEngineView:  # verl/workers/config/rollout.py CheckpointEngineConfig
    update_weights_bucket_megabytes: int


@dataclass(frozen=True, kw_only=True)
class RolloutView:  # verl/workers/config/rollout.py RolloutConfig
    name: str | None
    mode: str
    n: int
    gpu_memory_utilization: float
    tensor_model_parallel_size: int
    data_parallel_size: int
    pipeline_model_parallel_size: int
    free_cache_engine: bool
    enforce_eager: bool
    enable_sleep_mode: bool = True  # RolloutConfig's default; verl's YAML does not set it
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    max_model_len: int | None
    layered_summon: bool
    load_format: str
    temperature: float
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: int | None
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    engine_kwargs: Mapping[str, Any]
    agent: AgentLoopView
    val_kwargs: SamplingView
    checkpoint_engine: CheckpointEngineView


@dataclass(frozen=True, kw_only=True)
class ModelView:  # verl/workers/config/model.py HFModelConfig
    path: str
    hf_config_path: str | None
    tokenizer_path: str | None
    lora_rank: int
    target_modules: Any
    target_parameters: Any = None  # HFModelConfig's default; verl's YAML does not set it
    use_remove_padding: bool
    use_fused_kernels: bool
    enable_gradient_checkpointing: bool
    enable_activation_offload: bool
    override_config: Mapping[str, Any]
    lora: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class DataView:  # verl/trainer/config/data/legacy_data.yaml
    train_files: Any
    val_files: Any
    prompt_key: str
    reward_fn_key: str
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int
    filter_overlong_prompts: bool
    apply_chat_template_kwargs: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class TrainerView:  # verl/trainer/config/ppo_trainer.yaml trainer
    n_gpus_per_node: int
    nnodes: int
    total_epochs: int
    total_training_steps: int | None
    test_freq: int
    save_freq: int
    val_before_train: bool
    use_v1: bool
    logger: Any
    experiment_name: str
    default_local_dir: str


@dataclass(frozen=True, kw_only=True)
class FilterGroupsView:  # verl/trainer/config/algorithm.py FilterGroupsConfig
    enable: bool
    metric: str | None


@dataclass(frozen=True, kw_only=True)
class AlgorithmView:  # verl/trainer/config/algorithm.py AlgoConfig
    adv_estimator: str
    use_kl_in_reward: bool
    filter_groups: FilterGroupsView


@dataclass(frozen=True, kw_only=True)
class CriticView:  # verl/workers/config/critic.py CriticConfig
    enable: bool | None
    ppo_mini_batch_size: int


@dataclass(frozen=True, kw_only=True)
class RewardManagerView:  # verl/workers/config/reward.py RewardManagerConfig
    name: str


@dataclass(frozen=True, kw_only=True)
class RewardModelView:  # verl/workers/config/reward.py RewardModelConfig
    enable: bool


@dataclass(frozen=True, kw_only=True)
class RewardView:  # verl/workers/config/reward.py RewardConfig
    reward_manager: RewardManagerView
    reward_model: RewardModelView
    custom_reward_function: Mapping[str, Any]
    reward_kwargs: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class RayInitView:  # ray_kwargs.ray_init: what verl hands ray.init()
    num_cpus: int | None
    address: str | None
    _temp_dir: str | None
    runtime_env: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class SimpleStorageView:  # transfer_queue.backend.SimpleStorage
    num_data_storage_units: int


@dataclass(frozen=True, kw_only=True)
class TransferQueueBackendView:  # transfer_queue.backend
    storage_backend: str
    SimpleStorage: SimpleStorageView


@dataclass(frozen=True, kw_only=True)
class TransferQueueView:  # verl/trainer/config/ppo_trainer.yaml transfer_queue
    backend: TransferQueueBackendView


# each top-level field of VerlView and the verl section it reads
SECTIONS = {"actor": A + "actor", "ref": A + "ref", "rollout": A + "rollout", "model": A + "model", "data": "data",
            "trainer": "trainer", "algorithm": "algorithm", "critic": "critic", "reward": "reward",
            "ray_init": "ray_kwargs.ray_init", "transfer_queue": "transfer_queue",
            "env_vars": "ray_kwargs.ray_init.runtime_env.env_vars"}


@dataclass(frozen=True, kw_only=True)
class VerlView:
    """verl's composed config: actor_rollout_ref's sections as verl's workers see them, then the trainer's."""

    actor: ActorView
    ref: RefView
    rollout: RolloutView
    model: ModelView
    data: DataView
    trainer: TrainerView
    algorithm: AlgorithmView
    critic: CriticView
    reward: RewardView
    ray_init: RayInitView
    transfer_queue: TransferQueueView
    env_vars: Mapping[str, Any]  # ray_init.runtime_env.env_vars: the environment of verl's Ray workers

    @classmethod
    def of(cls, verl: Mapping[str, Any] | None, *, defaults: bool = True) -> VerlView:
        """The view of a composed config; defaults=False: a key it lacks is None (what a job's log does not say)."""
        from grpo_lab.verl_schema import schema

        theirs = schema().defaults if defaults else {}
        return _section(cls, {f: schema_get(verl, p, _NO) for f, p in SECTIONS.items()},
                        {f: schema_get(theirs, p, _NO) for f, p in SECTIONS.items()})

    def at(self, dotted: str) -> Any:
        """The value at one of verl's dotted keys (for tables of keys); KeyError for a key the view does not hold."""
        field, rest = max(((f, dotted[len(p) + 1:]) for f, p in SECTIONS.items() if dotted.startswith(p + ".")),
                          key=lambda x: len(SECTIONS[x[0]]), default=(None, ""))
        if field is None:
            raise KeyError(dotted)
        v: Any = getattr(self, field)
        for part in rest.split("."):
            if dataclasses.is_dataclass(v):
                if part not in {name for name, *_ in _kinds(type(v))}:
                    raise KeyError(dotted)
                v = getattr(v, part)
            else:
                v = v.get(part) if isinstance(v, Mapping) else None
        return v


def given(verl: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    """A section of VerlView (SECTIONS) as the composed config gives it, every key of it (none of verl's defaults)."""
    v = schema_get(verl, SECTIONS[field])
    return v if isinstance(v, Mapping) else EMPTY


_VIEWS = {name: c for name, c in globals().items() if name.endswith("View") and dataclasses.is_dataclass(c)}


@functools.cache
def _kinds(cls: type) -> tuple[tuple[str, Any, Any], ...]:
    """(field, its view class or Mapping for a mapping section or None, its own default: verl's dataclass default)."""
    return tuple((f.name, _VIEWS.get(str(f.type)) or (Mapping if str(f.type).startswith("Mapping") else None),
                  None if f.default is dataclasses.MISSING else f.default) for f in dataclasses.fields(cls))


def _child(d: Any, name: str) -> Any:
    return d.get(name, _NO) if isinstance(d, Mapping) else _NO


def _section(cls: type, ours: Any, theirs: Any) -> Any:
    values = {}
    for name, kind, own in _kinds(cls):
        g, d = _child(ours, name), _child(theirs, name)
        if kind is Mapping:
            values[name] = freeze(g if isinstance(g, Mapping) else d if isinstance(d, Mapping) else EMPTY)
        elif kind is not None:
            values[name] = _section(kind, g, d)
        elif g is not _NO:
            values[name] = freeze(g)
        elif d is not _NO and d != "???":  # "???": verl has no default, the config must give it
            values[name] = freeze(d)
        else:
            values[name] = own
    return cls(**values)


# ---- the numbers verl needs, by key (rules.values) ----------------------------------------------------------------

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


def is_kind(value: Any, kind: type) -> bool:
    return not isinstance(value, bool) and isinstance(value, int if kind is int else (int, float))


def wrong_types(cfg: VerlView) -> Iterator[tuple[str, Any, Any, str, Any, str]]:
    """(key, value, verl's default, what it must be, fix value, why) of each number verl needs that is no number, or
    null where verl's own default is a number. A key that only follows one named already (the ref's log-prob
    micro-batch reads the rollout's) is not named again."""
    from grpo_lab.cli.knobs import followers
    from grpo_lab.verl_schema import schema

    named: dict[str, Any] = {}
    defaults = schema().defaults
    for key, kind, _, fix, why in NUMBERS:
        v = cfg.at(key)
        default = schema_get(defaults, key)
        if v is None and default is None or is_kind(v, kind):
            continue
        if kind is int and isinstance(v, float) and v.is_integer():
            continue
        if any(key in followers().get(k, ()) and named[k] == v for k in named):
            continue
        named[key] = v
        yield key, v, default, "a whole number" if kind is int else "a number", fix, why


def below_range(cfg: VerlView) -> Iterator[tuple[str, Any, float, Any, str]]:
    """(key, value, lowest allowed, fix value, why) of each number of NUMBERS below what verl can use."""
    for key, kind, lo, fix, why in NUMBERS:
        v = cfg.at(key)
        if lo is None or v is None or not is_kind(v, kind) and not (kind is int and isinstance(v, float)):
            continue
        if v < lo:
            yield key, v, lo, fix, why
