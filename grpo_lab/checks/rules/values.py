"""Rules on the values: single values verl accepts without a word and then fails on, or trains nothing with; and what
they add up to on the cards: the memory plan (grpo_lab/memory/memplan.py) of the model planned, with the settings it
reads of verl's config (settings_from_verl).

The model planned is the one verl will load: a local folder's config.json, else the Hugging Face cache's copy of the
hub id, else the conf/model/ group whose model_path is that id (MODEL_PATH=Qwen/Qwen3-0.6B plans the 0.6B, whatever
the model group), else the model group's own facts (lab.model).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from grpo_lab import facts
from grpo_lab.checks.rules import ALT, A, Ctx, Problem, error, note, oom, rule, warn
from grpo_lab.cli.config import safe_name, unsafe_name
from grpo_lab.cli.knobs import KNOBS
from grpo_lab.facts import preset_learning_rates
from grpo_lab.labconf import Lab
from grpo_lab.memory import calibration, engines, memplan
from grpo_lab.verl_keys import get as _get

# --------------------------------------------------------------------------------- values verl takes but cannot use


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


# ---------------------------------------------------------------------- the memory plan, and which model is planned


@dataclass
class ModelFacts:
    arch: memplan.Arch | None
    info: dict[str, Any] = field(default_factory=dict)  # name, hub_id, thinking (a model group's lab.model)
    mismatch: str = ""  # model_path names no model we know, and the model group is another one
    notes: list[str] = field(default_factory=list)
    # the folder's mark: random weights, for memory and speed only (grpo_lab.tasks.qwen3_random)
    random_weights: str = ""
    # max_position_embeddings of the model's own config, when override_config raised it
    file_positions: int | None = None


def _from_config_json(path: Path, source: str) -> memplan.Arch:
    cfg = json.loads(path.read_text())
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    return memplan.Arch.from_mapping(cfg, source=source)


def position_override(c: Ctx) -> int | None:
    """actor_rollout_ref.model.override_config's max_position_embeddings (under its model_config when it has one), as
    verl 0.9.1 sets it on the model's config before the rollout checks max_model_len against it
    (verl/workers/config/model.py HFModelConfig.__post_init__ -> verl/utils/model.py update_model_config)."""
    ov = c.get(A + "model.override_config", {}) or {}
    ov = ov.get("model_config", ov) if isinstance(ov, Mapping) else {}
    v = ov.get("max_position_embeddings") if isinstance(ov, Mapping) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def resolve_model(c: Ctx) -> ModelFacts:
    """The model verl will load (module docstring), with the positions override_config gives it."""
    m = _model_files(c)
    positions = position_override(c)
    if m.arch is not None and positions is not None:
        m.file_positions = m.arch.max_position_embeddings
        m.arch = replace(m.arch, max_position_embeddings=positions)
    return m


def _model_files(c: Ctx) -> ModelFacts:
    path = str(c.get(A + "model.hf_config_path") or c.get(A + "model.path") or "")
    group = asdict(c.lab.model)
    groups = facts.model_groups()
    known = groups.get(path)
    info = dict(known) if known else group
    local = Path(os.path.expanduser(path)) if path else None
    notes: list[str] = []
    if local is not None and (local / "config.json").is_file():
        try:
            return ModelFacts(_from_config_json(local / "config.json", str(local / "config.json")), info,
                              random_weights=facts.random_weights_mark(local / "config.json"))
        except (OSError, ValueError, KeyError, TypeError) as e:
            notes.append(f"could not read {local / 'config.json'} ({e}); planning the model group's facts")
    elif local is not None and local.is_dir():  # a folder with no model in it is no model: not the group's either
        return ModelFacts(None, {}, notes=[f"memory plan skipped: {path} holds no config.json, so there is no model "
                                           f"to plan (the model option's {group.get('name')} is not planned in its "
                                           f"place)"])
    cached = facts.hf_cached_config(path, c.environ) if path and not (local and local.exists()) else None
    if cached is not None:
        try:
            return ModelFacts(_from_config_json(cached, str(cached)), info, notes=notes)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    if known and all(known.get(k) is not None for k in memplan.Arch.FIELDS):
        return ModelFacts(memplan.Arch.from_mapping(known, source=f"conf/model ({known.get('name')}: {path})"),
                          info, notes=notes)
    if all(group.get(k) is not None for k in memplan.Arch.FIELDS):
        hub = group.get("hub_id")
        mismatch = ""
        if path and hub and path != hub and not (local and local.exists()):
            mismatch = path
        return ModelFacts(memplan.Arch.from_mapping(group, source=f"lab.model ({group.get('name')})"), group,
                          mismatch, notes)
    return ModelFacts(None, info, notes=notes + [
        "no architecture facts (no local config.json, no known model, no lab.model): memory plan skipped"])


def settings_from_verl(verl: Mapping[str, Any], lab: Lab) -> memplan.Settings:
    """The memory-relevant settings of a resolved verl config (plain dict) and the job's card and host (`lab`)."""
    n_gpus = int(_get(verl, "trainer.n_gpus_per_node", 1)) * int(_get(verl, "trainer.nnodes", 1))
    override = _get(verl, A + "model.override_config", {}) or {}
    entropy_coeff = _get(verl, A + "actor.entropy_coeff", 0) or 0
    use_kl = bool(_get(verl, A + "actor.use_kl_loss", False)) or bool(_get(verl, "algorithm.use_kl_in_reward", False))
    max_model_len = _get(verl, A + "rollout.max_model_len")
    return memplan.Settings(
        n_gpus=max(1, n_gpus),
        card_gb=float(lab.hardware.gpu_memory_gb or 0),
        host_ram_gb=lab.hardware.host_ram_gb,
        fsdp_size=int(_get(verl, A + "actor.fsdp_config.fsdp_size", -1)),
        nnodes=max(1, int(_get(verl, "trainer.nnodes", 1) or 1)),
        strategy=str(_get(verl, A + "actor.strategy", "fsdp") or "fsdp"),
        ref_model_dtype=str(_get(verl, A + "ref.fsdp_config.model_dtype", "fp32") or "bf16"),
        # verl 0.9.1: fsdp_config.ulysses_sequence_parallel_size; the deprecated actor key wins when above 1
        sp_size=max(int(_get(verl, A + "actor.ulysses_sequence_parallel_size", 1) or 1),
                    int(_get(verl, A + "actor.fsdp_config.ulysses_sequence_parallel_size", 1) or 1)),
        lora_rank=int(_get(verl, A + "model.lora_rank", 0) or 0),
        lora_targets=_get(verl, A + "model.target_modules", "all-linear"),
        param_offload=bool(_get(verl, A + "actor.fsdp_config.param_offload", False)),
        optimizer_offload=bool(_get(verl, A + "actor.fsdp_config.optimizer_offload", False)),
        model_dtype=str(_get(verl, A + "actor.fsdp_config.model_dtype", "fp32") or "fp32"),
        gradient_checkpointing=bool(_get(verl, A + "model.enable_gradient_checkpointing", True)),
        activation_offload=bool(_get(verl, A + "model.enable_activation_offload", False)),
        attn_implementation=str(override.get("attn_implementation", "flash_attention_2")),
        use_dynamic_bsz=bool(_get(verl, A + "actor.use_dynamic_bsz", False)),
        ppo_max_token_len_per_gpu=int(_get(verl, A + "actor.ppo_max_token_len_per_gpu", 16384)),
        ppo_micro_batch_size_per_gpu=_int_or_none(_get(verl, A + "actor.ppo_micro_batch_size_per_gpu")),
        entropy_in_update=bool(_get(verl, A + "actor.calculate_entropy", False)) or float(entropy_coeff) != 0.0,
        entropy_checkpointing=bool(_get(verl, A + "actor.entropy_checkpointing", False)),
        actor_entropy_chunking=bool(_get(verl, A + "actor.entropy_from_logits_with_chunking", False)),
        entropy_chunk_size=int(_get(verl, A + "actor.entropy_from_logits_chunk_size", 2048)),
        use_torch_compile=bool(_get(verl, A + "actor.use_torch_compile", True))
        and bool(_get(verl, A + "actor.fsdp_config.use_torch_compile", True)),
        use_fused_kernels=bool(_get(verl, A + "model.use_fused_kernels", False)),
        use_remove_padding=bool(_get(verl, A + "model.use_remove_padding", True)),
        max_prompt_length=int(_get(verl, "data.max_prompt_length", 512)),
        max_response_length=int(_get(verl, "data.max_response_length", 512)),
        log_prob_use_dynamic_bsz=bool(_get(verl, A + "rollout.log_prob_use_dynamic_bsz", False)),
        log_prob_max_token_len_per_gpu=int(_get(verl, A + "rollout.log_prob_max_token_len_per_gpu", 16384)),
        log_prob_micro_batch_size_per_gpu=_int_or_none(_get(verl, A + "rollout.log_prob_micro_batch_size_per_gpu")),
        ref_used=use_kl,
        ref_log_prob_use_dynamic_bsz=bool(_get(verl, A + "ref.log_prob_use_dynamic_bsz", False)),
        ref_log_prob_max_token_len_per_gpu=int(_get(verl, A + "ref.log_prob_max_token_len_per_gpu", 16384)),
        ref_log_prob_micro_batch_size_per_gpu=_int_or_none(_get(verl, A + "ref.log_prob_micro_batch_size_per_gpu")),
        ref_entropy_chunking=bool(_get(verl, A + "ref.entropy_from_logits_with_chunking", False)),
        ref_param_offload=bool(_get(verl, A + "ref.fsdp_config.param_offload", False)),
        rollout_engine=str(_get(verl, A + "rollout.name", "vllm")),
        gpu_memory_utilization=float(_get(verl, A + "rollout.gpu_memory_utilization", 0.5)),
        tp=int(_get(verl, A + "rollout.tensor_model_parallel_size", 1) or 1),
        rollout_dp=int(_get(verl, A + "rollout.data_parallel_size", 1) or 1),
        free_cache_engine=bool(_get(verl, A + "rollout.free_cache_engine", True)),
        enforce_eager=bool(_get(verl, A + "rollout.enforce_eager", False)),
        max_num_seqs=int(_get(verl, A + "rollout.max_num_seqs", 256)),
        max_num_batched_tokens=int(_get(verl, A + "rollout.max_num_batched_tokens", 8192)),
        enable_chunked_prefill=bool(_get(verl, A + "rollout.enable_chunked_prefill", True)),
        max_model_len=int(max_model_len) if max_model_len else None,
        layered_summon=bool(_get(verl, A + "rollout.layered_summon", False)),
        vllm_kv_cache_bytes=_positive_int(_get(verl, A + "rollout.engine_kwargs.vllm.kv_cache_memory_bytes")),
        bucket_mb=int(_get(verl, A + "rollout.checkpoint_engine.update_weights_bucket_megabytes", 2048)),
        train_batch_size=int(_get(verl, "data.train_batch_size", 128)),
        rollout_n=int(_get(verl, A + "rollout.n", 1)),
        ppo_mini_batch_size=int(_get(verl, A + "actor.ppo_mini_batch_size", 0) or 0),
        ppo_epochs=int(_get(verl, A + "actor.ppo_epochs", 1) or 1),
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


def plan_memory(c: Ctx) -> dict[str, Any]:
    m = c.model
    c.notes.extend(m.notes)
    if m.arch is None:
        return {}
    nulls = [key for key, v, *_ in wrong_types(c) if v is None]  # the plan would read verl's default in their place
    if nulls:
        c.notes.append(f"memory plan skipped until the values named above are numbers ({', '.join(nulls)}: null)")
        return {}
    try:
        s = settings_from_verl(c.verl, c.lab)
    except (TypeError, ValueError) as e:
        c.notes.append(f"memory plan skipped until the values named above are numbers ({e})")
        return {}
    engine = str(s.rollout_engine or "vllm").lower()
    if engine not in engines.ENGINES:  # verl may know it (trtllm); the plan has not been measured with it
        why = (f"rollout engine {s.rollout_engine!r} not measured: the memory plan knows how "
               f"{' and '.join(engines.ENGINES)} use gpu_memory_utilization (grpo_lab/memory/engines.py), not this "
               f"one, so it gives no memory verdict for this job (weights, KV cache and the phases unchecked)")
        c.notes.append(why)
        return {"params": m.arch.params(), "architecture_source": m.arch.source, "rollout_engine": s.rollout_engine,
                "verdict": {"overall": "not measured"}, "not_measured": why}
    if s.card_gb <= 0:  # card_memory_unknown refuses it
        return {"params": m.arch.params(), "architecture_source": m.arch.source}
    util = s.gpu_memory_utilization
    if not 0.0 < util <= 1.0 or (util == 1.0 and engine == "vllm"):
        # refused by gpu_memory_utilization_range (out of (0, 1], or 1.0 on vLLM); plan with the guide's 0.4
        s = replace(s, gpu_memory_utilization=0.4)
        c.notes.append("memory plan made with gpu_memory_utilization 0.4 (the configured value is refused)")
    if m.arch.is_moe:
        a = m.arch
        c.notes.append(f"mixture of experts: {a.num_experts} experts, {a.num_experts_per_tok} per token in "
                       f"{a.sparse_layers} layers: planned with all {a.params() / 1e9:.1f}B parameters for weights, "
                       f"gradients, optimizer and vLLM, {a.active_params() / 1e9:.1f}B active for activations")
    plan = memplan.memory_plan(m.arch, s, remedies=not c.quick)
    plan["_settings"] = s
    for phase, opts in list(plan.get("remedies", {}).items()):  # once some remedy ends the OOM, drop those that do not
        if any(o["verdict"] != "oom" for o in opts):
            plan["remedies"][phase] = [o for o in opts if o["verdict"] != "oom"]
    return plan


def _fix_for(plan: dict[str, Any], phase: str) -> str:
    opts = plan.get("remedies", {}).get(phase, [])
    good = [r for r in opts if r["verdict"] == "fits"] or [r for r in opts if r["verdict"] == "tight"]
    return good[0]["override"] if good else (opts[0]["override"] if opts else "")


def _pin_fix(c: Ctx) -> str:
    """The user's vLLM KV-cache pin set to the cache the plan gives vLLM without it, where that is smaller; else ""."""
    from grpo_lab.checks.rules import thaw
    from grpo_lab.launch.prepare import KEY, planned_kv_bytes

    pin, verl = c.plan["_settings"].vllm_kv_cache_bytes, thaw(c.verl)
    _get(verl, KEY.rpartition(".")[0], {}).pop(KEY.rpartition(".")[2], None)
    n = planned_kv_bytes(verl, c.lab, c.environ) if pin else None
    return f"+{KEY}={n}" if n and n < pin else ""


def _alternatives(plan: dict[str, Any], phase: str) -> str:
    opts = plan.get("remedies", {}).get(phase, [])
    if not opts:
        return ""
    return " Remedies (guide's order), predicted peak after each: " + "; ".join(
        f"{r['override']} -> {r['peak_gb_per_gpu']} GB {r['verdict']}" for r in opts) + "."


def card_gb(lab: Lab) -> float | None:
    """One card's memory from lab.hardware.gpu_memory_gb when it is a positive number; else None."""
    v = lab.hardware.gpu_memory_gb  # typed: a number or None (grpo_lab/labconf.py)
    return float(v) if v is not None and v > 0 else None


@rule("card_memory_unknown", kind="plan", phase="preflight")
def card_memory_unknown(c: Ctx) -> Iterable[Problem]:
    """No card size (lab.hardware.gpu_memory_gb 0, negative, null or no number): the plan gives no phase a verdict,
    so it refuses instead of passing as "OK" (the fix: the hardware option's own size)."""
    if card_gb(c.lab) is not None:
        return
    raw, name = c.lab.hardware.gpu_memory_gb, str(c.lab.hardware.name or "")
    size = facts.hardware_card_gb(name) if name else None
    what = f"{c.model.info.get('name') or 'the model'}" if c.model else "the model"
    yield error(f"lab.hardware.gpu_memory_gb={'null' if raw is None else f'{raw:g}'} is no card size: it must be one "
                f"card's memory in GB as CUDA reports it (32 for the guide's RTX 4080 32 GB, 139.8 for an H200). "
                f"Without it the memory plan gives no phase a verdict, so nothing says whether {what} fits the cards"
                + (f"; the hardware option {name} says {size:g}" if size else ""),
                f"lab.hardware.gpu_memory_gb={size:g}" if size else
                "set lab.hardware.gpu_memory_gb to one card's memory in GB (nvidia-smi --query-gpu=memory.total "
                "--format=csv), or pick a hardware option: hardware=rtx4080x4")


@rule("model_arch_mismatch", kind="plan", phase="preflight")
def model_arch_mismatch(c: Ctx) -> Iterable[Problem]:
    m = c.model
    if m.mismatch:
        yield warn(f"model_path is {m.mismatch!r}, which is none of conf/model's models, has no local config.json and "
                   f"is not in the Hugging Face cache; the memory plan and the thinking-mode check use the model "
                   f"group {m.info.get('name')!r} ({m.info.get('hub_id')})",
                   "pick the model group that matches (e.g. model=qwen3_4b), or point model_path at a local folder "
                   "with its config.json")


@rule("rollout_tp_heads", kind="setup", phase="start-up")
def rollout_tp_heads(c: Ctx) -> Iterable[Problem]:
    """vLLM splits attention heads over tensor-parallel ranks: it refuses a TP that does not divide the model's
    attention heads (SmolLM2-135M has 9: TP 2 cannot serve it)."""
    arch = c.model.arch
    tp = c.get(A + "rollout.tensor_model_parallel_size", 1)
    if arch is None or not isinstance(tp, int) or tp <= 1:
        return
    heads = arch.num_attention_heads
    if heads % tp:
        ok = [d for d in (1, 2, 4, 8) if heads % d == 0 and d < tp]
        yield error(f"rollout tensor parallel size {tp} does not divide the model's {heads} attention heads: vLLM "
                    f"refuses to start ({arch.source})", f"rollout_tp={max(ok)}" if ok else "")


@rule("full_finetune_too_big", kind="memory", phase="any")
def full_finetune_too_big(c: Ctx) -> Iterable[Problem]:
    plan = c.plan
    if not plan.get("phases"):
        return
    s, arch = plan["_settings"], c.model.arch
    state_full = plan["actor_state_full_gb_per_gpu"]
    if s.lora_rank == 0 and state_full > memplan.TIGHT_FRACTION * s.card_gb:
        big = arch.params() > 6e9
        pointer = memplan.LORA_OVERRIDES + (" " + memplan.OFFLOAD_OVERRIDES if big else "")
        yield oom(f"full fine-tuning of a {arch.params() / 1e9:.1f}B-parameter model needs 16 B per parameter for its "
                  f"weights, gradients and Adam state: {state_full:.1f} GB per GPU over {s.fsdp} GPUs, against "
                  f"{s.card_gb:g} GB cards, before any activation. verl loads all of it for the update even with "
                  f"offload. The guide: 8B and above only with LoRA (plus offload)"
                  + (" (model=qwen3_8b_lora is that recipe for Qwen3-8B)" if big else ""), pointer)


@rule("vllm_kv_cache", kind="memory", phase="start-up")
def vllm_kv_cache(c: Ctx) -> Iterable[Problem]:
    plan = c.plan
    if not plan.get("phases"):
        return
    s, kv = plan["_settings"], plan["kv_cache"]
    if kv["tokens"] <= 0:
        yield oom(f"vLLM's budget gpu_memory_utilization {s.gpu_memory_utilization} x {s.card_gb:g} GB = "
                  f"{kv['budget_gb']} GB cannot hold its own weights ({kv['vllm_weights_gb']} GB at TP {s.tp}) and "
                  f"activations ({kv['vllm_activation_gb']} GB): no room for a KV cache, vLLM refuses to start",
                  _fix_for(plan, "generation"))
    elif not kv["fits_max_model_len"]:
        yield oom(f"vLLM's KV cache ({kv['kv_cache_gb']} GB = {kv['tokens']} tokens) cannot hold one sequence of "
                  f"max_model_len={kv['max_model_len']} tokens, and vLLM refuses to start. rollout.max_model_len is "
                  f"null, so verl uses the model's max_position_embeddings; GRPO here never generates past prompt + "
                  f"response = {kv['sequence_length']}",
                  f"actor_rollout_ref.rollout.max_model_len={kv['sequence_length']}")


def _how_sure(plan: dict[str, Any], phase: str) -> str:
    cal = (plan.get("calibration") or {}).get(phase)
    return calibration.describe(cal) if cal else "not calibrated"


def _phase_rule(phase: str, label: str, job_phase: str):
    def check(c: Ctx) -> Iterable[Problem]:
        plan = c.plan
        if not plan.get("phases"):
            return
        card = plan["_settings"].card_gb
        ph, v = plan["phases"][phase], plan["verdict"][phase]
        peak = ph["peak_gb_per_gpu"]
        parts = " + ".join(f"{k.replace('_', ' ')} {val}" for k, val in ph["components_gb"].items() if val)
        if phase == "training":
            parts = f"{ph['peak_of']}: {parts}"
        margin = float(((plan.get("calibration") or {}).get(phase) or {}).get("margin", 0.0))
        fix = (phase == "generation" and v != "fits" and _pin_fix(c)) or _fix_for(plan, phase)
        if v == "oom":
            comps = ph["components_gb"]
            exact = float(comps.get("vllm_budget", comps.get("sglang_static", 0.0))) if phase == "generation" else 0.0
            if phase == "generation" and memplan.verdict_of(peak, card, margin, exact) != "oom":
                return  # the engine cannot start (no KV cache for one sequence): vllm_kv_cache says why
            of = " on what is not the engine's exact budget" if exact else ""
            yield oom(f"{label} phase: predicted peak {peak} GB per GPU on {card:g} GB cards, {peak / card - 1:.0%} "
                      f"above the card ({parts}); beyond the plan's margin of {margin:.0%}{of} "
                      f"({_how_sure(plan, phase)}).{_alternatives(plan, phase)}", fix)
        elif v == "tight" and peak > card:
            yield warn(f"{label} phase may not fit: predicted peak {peak} GB per GPU, {peak / card - 1:.0%} above the "
                       f"{card:g} GB card, within the plan's margin of {margin:.0%} for this regime, so not refused "
                       f"({_how_sure(plan, phase)}) ({parts}). If it runs out of memory, apply the fix."
                       f"{_alternatives(plan, phase)}", fix)
        elif v == "tight":
            yield warn(f"{label} phase is tight: predicted peak {peak} GB of {card:g} GB ({peak / card:.0%}, above "
                       f"{int(memplan.TIGHT_FRACTION * 100)}%; {_how_sure(plan, phase)}) ({parts})."
                       f"{_alternatives(plan, phase)}", fix)

    check.__name__ = f"memory_{phase}"
    return rule(f"memory_{phase}", kind="memory", phase=job_phase)(check)


# the memory plan's phase, how the message names it, the job's phase (grpo_lab/registry.py PHASES)
for _phase, _label, _job_phase in (("generation", "generation", "rollout"), ("training", "training", "update"),
                                   ("weight_sync", "weight-sync", "weight sync")):
    _phase_rule(_phase, _label, _job_phase)


@rule("memory_host_ram", kind="memory", phase="any")
def memory_host_ram(c: Ctx) -> Iterable[Problem]:
    plan = c.plan
    if not plan.get("phases"):
        return
    host = plan["host_ram"]
    node = " per node" if host.get("per_node") else ""
    if host["verdict"] == "oom":
        fix = _fix_for(plan, "host_ram")
        if not fix:  # no override of the model's settings helps: each GPU's processes take ~6 GB of the node's RAM
            s = plan["_settings"]
            per_gpu = memplan.HOST_PER_GPU_WORKER_GB + memplan.HOST_PER_VLLM_WORKER_GB
            fixed = max(host["total_gb"] - s.n_gpus // max(1, s.nnodes) * per_gpu, memplan.HOST_BASE_GB)
            k = int((host["capacity_gb"] - fixed) // per_gpu)
            per_node = s.n_gpus // max(1, s.nnodes)
            fix = (f"ngpus_per_node={k}" if 1 <= k < per_node else
                   f"run where a node has at least {host['total_gb']:.0f} GB of RAM (lab.hardware.host_ram_gb is "
                   f"what the hardware file assumes)")
        yield oom(f"host RAM{node}: predicted {host['total_gb']} GB of {host['capacity_gb']} GB "
                  f"({', '.join(f'{k} {v}' for k, v in host['components_gb'].items() if v)})."
                  f"{_alternatives(plan, 'host_ram')}", fix)
    elif host["verdict"] == "tight":
        yield warn(f"host RAM{node} is tight: predicted {host['total_gb']} GB of {host['capacity_gb']} GB",
                   _fix_for(plan, "host_ram"))


@rule("memory_notes", kind="plan", phase="preflight")
def memory_notes(c: Ctx) -> Iterable[Problem]:
    """The plan's own notes (what was planned from where, what was skipped)."""
    c.plan  # noqa: B018 (plans once, fills c.notes)
    for n in c.notes:
        yield note(n)
    c.notes.clear()
