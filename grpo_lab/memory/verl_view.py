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


def _view(name: str, fields: str, **special: Any) -> type:
    """A frozen view class of one of verl's sections: `fields` (verl's names, space-separated) hold the composed value;
    in `special`, a view class is a section of its own, Mapping a mapping section (read-only), any other value the
    default of verl's dataclass for a key verl's YAML leaves out."""
    spec: list[Any] = [(f, Any) for f in fields.split()]
    spec += [(f, v) if isinstance(v, type) else (f, Any, dataclasses.field(default=v)) for f, v in special.items()]
    return dataclasses.make_dataclass(name, spec, namespace={"__module__": __name__}, frozen=True, kw_only=True)


# verl/workers/config/engine.py FSDPEngineConfig
FSDPConfigView = _view("FSDPConfigView", "fsdp_size param_offload optimizer_offload model_dtype "
                       "ulysses_sequence_parallel_size use_torch_compile")
OptimView = _view("OptimView", "lr")  # verl/workers/config/optimizer.py FSDPOptimizerConfig
# verl/workers/config/actor.py FSDPActorConfig
ActorView = _view(
    "ActorView", "strategy ppo_mini_batch_size ppo_micro_batch_size ppo_micro_batch_size_per_gpu use_dynamic_bsz "
    "ppo_max_token_len_per_gpu ppo_epochs use_kl_loss kl_loss_coef entropy_coeff calculate_entropy "
    "calculate_sum_pi_squared entropy_checkpointing entropy_from_logits_with_chunking entropy_from_logits_chunk_size "
    "use_torch_compile ulysses_sequence_parallel_size", optim=OptimView, fsdp_config=FSDPConfigView)
# verl/trainer/config/ref/dp_ref.yaml
RefView = _view("RefView", "log_prob_micro_batch_size log_prob_micro_batch_size_per_gpu log_prob_use_dynamic_bsz "
                "log_prob_max_token_len_per_gpu entropy_from_logits_with_chunking", fsdp_config=FSDPConfigView)
# verl/workers/config/rollout.py RolloutConfig, its AgentLoopConfig, SamplingConfig and CheckpointEngineConfig
RolloutView = _view(
    "RolloutView", "name mode n gpu_memory_utilization tensor_model_parallel_size data_parallel_size "
    "pipeline_model_parallel_size free_cache_engine enforce_eager max_num_seqs max_num_batched_tokens "
    "enable_chunked_prefill max_model_len layered_summon load_format temperature log_prob_micro_batch_size "
    "log_prob_micro_batch_size_per_gpu log_prob_use_dynamic_bsz log_prob_max_token_len_per_gpu",
    enable_sleep_mode=True,  # RolloutConfig's default; verl's YAML does not set it
    engine_kwargs=Mapping, agent=_view("AgentLoopView", "num_workers"), val_kwargs=_view("SamplingView", "n"),
    checkpoint_engine=_view("CheckpointEngineView", "update_weights_bucket_megabytes"))
# verl/workers/config/model.py HFModelConfig
ModelView = _view(
    "ModelView", "path hf_config_path tokenizer_path lora_rank target_modules use_remove_padding use_fused_kernels "
    "enable_gradient_checkpointing enable_activation_offload",
    target_parameters=None,  # HFModelConfig's default; verl's YAML does not set it
    override_config=Mapping, lora=Mapping)
# verl/trainer/config/data/legacy_data.yaml
DataView = _view("DataView", "train_files val_files prompt_key reward_fn_key max_prompt_length max_response_length "
                 "train_batch_size filter_overlong_prompts", apply_chat_template_kwargs=Mapping)
# verl/trainer/config/ppo_trainer.yaml trainer
TrainerView = _view("TrainerView", "n_gpus_per_node nnodes total_epochs total_training_steps test_freq save_freq "
                    "val_before_train use_v1 logger experiment_name default_local_dir")
# verl/trainer/config/algorithm.py AlgoConfig and its FilterGroupsConfig
AlgorithmView = _view("AlgorithmView", "adv_estimator use_kl_in_reward",
                      filter_groups=_view("FilterGroupsView", "enable metric"))
CriticView = _view("CriticView", "enable ppo_mini_batch_size")  # verl/workers/config/critic.py CriticConfig
# verl/workers/config/reward.py RewardConfig, its RewardManagerConfig and RewardModelConfig
RewardView = _view("RewardView", "", reward_manager=_view("RewardManagerView", "name"),
                   reward_model=_view("RewardModelView", "enable"), custom_reward_function=Mapping,
                   reward_kwargs=Mapping)
# ray_kwargs.ray_init: what verl hands ray.init()
RayInitView = _view("RayInitView", "num_cpus address _temp_dir", runtime_env=Mapping)
# verl/trainer/config/ppo_trainer.yaml transfer_queue, its backend and the backend's SimpleStorage
TransferQueueView = _view("TransferQueueView", "", backend=_view(
    "TransferQueueBackendView", "storage_backend",
    SimpleStorage=_view("SimpleStorageView", "num_data_storage_units")))


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


@functools.cache
def _kinds(cls: type) -> tuple[tuple[str, Any, Any], ...]:
    """(field, its view class or Mapping for a mapping section or None, its own default: verl's dataclass default)."""
    out = []
    for f in dataclasses.fields(cls):
        t = globals().get(f.type, f.type) if isinstance(f.type, str) else f.type  # VerlView's annotations are text
        kind = t if dataclasses.is_dataclass(t) else Mapping if t is Mapping or str(t).startswith("Mapping") else None
        out.append((f.name, kind, None if f.default is dataclasses.MISSING else f.default))
    return tuple(out)


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
    for key, kind, _, fix, why in NUMBERS:
        v = cfg.at(key)
        default = schema_get(schema().defaults, key)
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
