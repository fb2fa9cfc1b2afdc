"""Rules from verl's issue tracker: configurations verl users reported failing late (after Ray, the model and often the
first generation), each checked against verl 0.9.1's code. docs/verl_issues.md lists every issue taken, what failed,
the verdict for 0.9.1 (with the line of verl that decides it) and the rule that refuses it here; the other issues of
that list are cases of rules.batch, rules.setup and rules.memory.

    agent_loop_workers        verl #6801: the legacy trainer splits each generation batch over agent.num_workers
    ulysses_sequence_parallel verl #1226: Ulysses SP must divide the attention heads, the GPUs, and needs remove-padding
    rollout_max_model_len     verl #673: rollout.max_model_len against the prompt, the response and the model
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from grpo_lab import facts
from grpo_lab.checks.rules import A, ALT, Ctx, Problem, error, rule, warn
from grpo_lab.checks.rules.batch import as_int, sp_size
from grpo_lab.checks.rules.memory import position_override

ENV_VARS = facts.RAY_ENV_VARS


def _divisor_le(n: int, limit: int) -> int:
    return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


def _truthy(v: Any) -> bool:
    return str(v).upper() in ("TRUE", "1")


@rule("agent_loop_workers", kind="verl_issue", phase="rollout")
def agent_loop_workers(c: Ctx) -> Iterable[Problem]:
    """verl #6801, 'only support equal chunk. Got size of DataProto 60 and chunk 8'. verl 0.9.1's legacy trainer
    (trainer.use_v1=false: verl/trainer/ppo/ray_trainer.py) repeats each batch's prompts n times and hands them to
    AgentLoopManager.generate_sequences, which splits them with DataProto.chunk(agent.num_workers)
    (verl/experimental/agent_loop/agent_loop.py); DataProto.chunk asserts an equal split (verl/protocol.py) unless
    VERL_AUTO_PADDING is on. The V1 trainer (the default) splits a TensorDict instead, unequal chunks allowed
    (verl/trainer/ppo/v1/agent_loop_tq.py): nothing to refuse there."""
    if bool(c.get("trainer.use_v1", True)):
        return
    env_vars = c.get(ENV_VARS, {}) or {}
    padding = (env_vars.get("VERL_AUTO_PADDING") if isinstance(env_vars, Mapping) else None) \
        or c.environ.get("VERL_AUTO_PADDING")
    if _truthy(padding):
        return
    tb, n = c.batch["train_batch_size"], c.batch["rollout_n"]
    workers = as_int(c.get(A + "rollout.agent.num_workers", 8), 8)
    if tb <= 0 or n <= 0 or workers <= 0:
        return
    size = tb * n + (tb if str(c.get("algorithm.adv_estimator")) == "remax" else 0)  # REMAX adds a greedy baseline
    if size % workers:
        ok = _divisor_le(size, workers)
        yield error(f"trainer.use_v1=false: verl 0.9.1's legacy trainer splits each step's {size} generation requests "
                    f"({tb} prompts x {n} answers) over actor_rollout_ref.rollout.agent.num_workers={workers} agent "
                    f"loop workers in equal parts, and {size}/{workers} = {size / workers:.2f}: it stops at the first "
                    f"generation with 'AssertionError: only support equal chunk. Got size of DataProto {size} and "
                    f"chunk {workers}' (verl #6801). The V1 trainer splits unequal parts",
                    ALT.join([f"{A}rollout.agent.num_workers={ok}", "trainer.use_v1=true"]))


def _sp_key(c: Ctx) -> str:
    """The key whose SP size verl uses: the deprecated actor.ulysses_sequence_parallel_size when above 1
    (FSDPActorConfig.__post_init__ copies it over), else actor.fsdp_config.ulysses_sequence_parallel_size."""
    old = as_int(c.get(A + "actor.ulysses_sequence_parallel_size", 1), 1)
    return A + ("actor.ulysses_sequence_parallel_size" if old > 1 else
                "actor.fsdp_config.ulysses_sequence_parallel_size")


@rule("ulysses_sequence_parallel", kind="verl_issue", phase="start-up")
def ulysses_sequence_parallel(c: Ctx) -> Iterable[Problem]:
    """verl #1226: Ulysses sequence parallelism splits the attention heads over the SP group. verl 0.9.1 asserts
    num_attention_heads % sp == 0 and (num_key_value_heads % sp == 0 or sp % num_key_value_heads == 0)
    (verl/models/transformers/monkey_patch.py apply_monkey_patch), builds a (dp, sp) device mesh over the GPUs
    (verl/workers/engine/fsdp/transformer_impl.py _init_device_mesh: torch refuses a shape that does not cover them)
    and raises without use_remove_padding (same file): all when the actor is built, after Ray has started."""
    sp = sp_size(c)
    if sp <= 1:
        return
    key, n_gpus = _sp_key(c), c.batch["n_gpus"]
    arch = c.model.arch if c.model else None
    heads = arch.num_attention_heads if arch else None
    kv = arch.num_key_value_heads if arch else None

    def fits(s: int) -> bool:
        heads_ok = heads is None or (heads % s == 0 and kv is not None and (kv % s == 0 or s % kv == 0))
        return n_gpus % s == 0 and heads_ok

    good = max(s for s in range(1, sp + 1) if fits(s))
    fix = f"{key}={good}"
    if n_gpus % sp:
        yield error(f"Ulysses sequence parallel size {sp} ({key}) does not divide the {n_gpus} GPUs: verl builds a "
                    f"(data parallel, {sp}) device mesh over them and torch refuses it when the actor is built", fix)
    elif heads is not None and (heads % sp or not (kv % sp == 0 or sp % kv == 0)):
        what = (f"the model's {heads} attention heads" if heads % sp else
                f"the model's {kv} key/value heads (nor they it)")
        yield error(f"Ulysses sequence parallel size {sp} ({key}) does not divide {what}: verl 0.9.1 asserts "
                    f"'num_attention_heads {heads} must be divisible by ulysses_sp_size {sp}' (or the key/value form) "
                    f"when it builds the actor, after Ray has started (verl #1226; {arch.source})", fix)
    if not bool(c.get(A + "model.use_remove_padding", False)):
        yield error(f"Ulysses sequence parallel size {sp} with actor_rollout_ref.model.use_remove_padding=false: verl "
                    f"0.9.1 raises 'When using sequence parallelism (ulysses_sequence_parallel_size > 1), you must "
                    f"enable `use_remove_padding`' when it builds the actor", f"{A}model.use_remove_padding=true")


def _vllm_reads_file_positions(c: Ctx, mml: int) -> bool:
    """vLLM reads the model's own config.json for its limit; VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets it go above."""
    own = c.model.file_positions if c.model else None
    if str(c.get(A + "rollout.name", "vllm")) != "vllm" or not own or mml <= own:
        return False
    env_vars = c.get(ENV_VARS, {}) or {}
    allow = (env_vars.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") if isinstance(env_vars, Mapping) else None) \
        or c.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    return not _truthy(allow)


@rule("rollout_max_model_len", kind="verl_issue", phase="start-up")
def rollout_max_model_len(c: Ctx) -> Iterable[Problem]:
    """verl #673 ('Input prompt (6768 tokens) is too long and exceeds limit of 4096'). verl 0.9.1's vLLM and SGLang
    servers take rollout.max_model_len as set (null: the model's max_position_embeddings) and raise when it is above
    max_position_embeddings (verl/workers/rollout/vllm_rollout/vllm_async_server.py _validate_configs, the same in
    sglang_rollout/async_sglang_server.py) at engine start; per request they raise when the prompt leaves no token
    of room (vllm_async_server.py generate: 'Prompt length (...) leaves no room to generate') and otherwise cap the
    answer at max_model_len - prompt tokens, below max_response_length without a word. The model's limit is
    override_config.max_position_embeddings when set (verl applies it to the model's config first: DAPO's recipe)."""
    if str(c.get(A + "rollout.name", "vllm")) not in ("vllm", "sglang"):
        return
    mml = c.get(A + "rollout.max_model_len")
    if mml is None and c.model and c.model.arch:  # verl then gives the engine the model's (overridden) limit
        mml = c.model.arch.max_position_embeddings
    if mml is None or isinstance(mml, bool):
        return
    mml = as_int(mml)
    prompt, resp = as_int(c.get("data.max_prompt_length", 0)), as_int(c.get("data.max_response_length", 0))
    if mml <= 0 or prompt <= 0 or resp <= 0:
        return
    arch = c.model.arch if c.model else None
    mpe = arch.max_position_embeddings if arch else None  # override_config's when set (rules.memory resolve_model)
    want = prompt + resp if not mpe else min(prompt + resp, mpe)
    fix = f"{A}rollout.max_model_len={want}"
    if mpe and mml > mpe:
        where = (f"{A}model.override_config.max_position_embeddings" if position_override(c) else arch.source)
        yield error(f"actor_rollout_ref.rollout.max_model_len={mml} is above the model's max_position_embeddings "
                    f"({mpe}, {where}): verl 0.9.1 raises 'max_model_len ({mml}) should be less than or equal "
                    f"to max_position_embeddings ({mpe})' when the rollout engine starts, after Ray and the actor", fix)
    elif _vllm_reads_file_positions(c, mml):
        own = c.model.file_positions
        yield error(f"actor_rollout_ref.rollout.max_model_len={mml} is above the model's own max_position_embeddings "
                    f"({own}, its config.json): {A}model.override_config.max_position_embeddings="
                    f"{position_override(c)} reaches verl, not vLLM (verl 0.9.1 hands vLLM only quantization "
                    f"overrides: vllm_async_server.py _apply_quantization), and vLLM 0.24 refuses 'User-specified "
                    f"max_model_len ({mml}) is greater than the derived max_model_len' at engine start unless "
                    f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set for its process (vllm/config/model.py)",
                    ALT.join([f"'+{ENV_VARS}.VLLM_ALLOW_LONG_MAX_MODEL_LEN=\"1\"'", f"{A}rollout.max_model_len={own}"]))
    elif mml <= prompt:
        yield error(f"actor_rollout_ref.rollout.max_model_len={mml} is not above max_prompt_length={prompt}: a prompt "
                    f"of {mml} or more tokens (the data admits up to {prompt}) leaves no room to generate, and verl "
                    f"0.9.1 stops the run with 'ValueError: Prompt length ... leaves no room to generate within the "
                    f"model's maximum context length ({mml})' when the first such prompt comes (verl #673)", fix)
    elif mml < prompt + resp:
        yield warn(f"actor_rollout_ref.rollout.max_model_len={mml} is below max_prompt_length + max_response_length "
                   f"= {prompt + resp}: verl 0.9.1 caps each answer at {mml} - its prompt's tokens, so an answer to a "
                   f"{prompt}-token prompt stops after {mml - prompt} tokens instead of {resp}, without a word", fix)
