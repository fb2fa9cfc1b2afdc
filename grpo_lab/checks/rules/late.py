"""Rules on what verl finds out only late, or never (each section below says which):

    key_unread                keys verl 0.9.1 takes and its V1 trainer never reads (docs/verl_unread_keys.md)
    emulation, emulation_torch
                              what an emulated smaller card really gets (grpo_lab/memory/emulate.py)
    reward_fn_file, reward_fn_result, reward_fn_data_source
                              the custom reward file, imported and called as verl will
    agent_loop_workers, ulysses_sequence_parallel, rollout_max_model_len
                              from verl's issue tracker (docs/verl_issues.md)

What each checks and why verl's own checks come too late: docs/preflight.md.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from typing import Any

from grpo_lab import facts
from grpo_lab.checks import reward_probe
from grpo_lab.checks.inputs import per_file_version
from grpo_lab.checks.rules import ALT, A, Ctx, Problem, error, note, rule, warn
from grpo_lab.checks.rules.batch import divisor_le
from grpo_lab.checks.rules.setup import ENV_VARS
from grpo_lab.cli.overrides import quote
from grpo_lab.memory import emulate
from grpo_lab.memory.planned_model import position_override
from grpo_lab.memory.settings import as_int, sp_size
from grpo_lab.verl_keys import MISSING, flatten, lookup, thaw
from grpo_lab.verl_schema import schema

# ---------------------------------------------------------------------------------- keys verl takes and never reads


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
    *((f"{part}.grad_clip", f"{part}.optim.clip_grad", f"verl/workers/config/{file}.py declares it, and verl's "
       f"engines clip with the optimizer's clip_grad (verl/workers/engine/fsdp/transformer_impl.py)")
      for part, file in (("actor_rollout_ref.actor", "actor"), ("critic", "critic"))),
    # "Deprecated and ignored. Use global_profiler.steps." (verl/trainer/config/ppo_trainer.yaml, actor/actor.yaml,
    # rollout/rollout.yaml, ref/ref.yaml, critic/critic.yaml; verl/utils/profiler/precision_debugger_profile.py)
    *((f"{part}.precision_debugger.steps", "global_profiler.steps",
       "verl's config says 'Deprecated and ignored. Use global_profiler.steps.' "
       "(verl/utils/profiler/precision_debugger_profile.py)")
      for part in ("global_profiler.global_tool_config", "actor_rollout_ref.actor.profiler.tool_config",
                   "actor_rollout_ref.ref.profiler.tool_config", "actor_rollout_ref.rollout.profiler.tool_config",
                   "critic.profiler.tool_config")),
    # declared in verl's config and its dataclasses; no code of verl 0.9.1 reads them
    *((f"actor_rollout_ref.{file}.{key}", None, f"verl/workers/config/{file}.py declares it and no code of verl "
       f"0.9.1 reads it") for file, key in (("rollout", "over_sample_rate"), ("rollout", "multi_stage_wake_up"),
                                            ("rollout", "multi_turn.num_repeat_rollouts"),
                                            ("actor", "freeze_vision_tower"))),
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


def _shown(v: Any) -> str:
    return "null" if v is None or v is MISSING else quote(thaw(v))


@rule("key_unread", kind="setup", phase="compose")
def key_unread(c: Ctx) -> Iterable[Problem]:
    """A key verl 0.9.1 takes and never reads (UNREAD), set to something verl's default is not and that the key verl
    reads does not already hold: refused with the key it reads, or its default."""
    defaults = schema().defaults
    if not defaults:
        yield note("keys verl 0.9.1 never reads not checked: verl's config defaults could not be read")
        return
    seen: set[str] = set()
    v1 = bool(c.cfg.trainer.use_v1)
    for prefix, reads, why in UNREAD:
        value = lookup(c.verl, prefix)
        if value is MISSING or (why.startswith(V1) and not v1):
            continue
        for key, v in flatten(value, prefix + "."):
            default = lookup(defaults, key)
            if key in seen or thaw(v) == (None if default is MISSING else thaw(default)):
                continue
            seen.add(key)
            if reads:
                target = reads + key[len(prefix):]
                now = lookup(c.verl, target)
                if thaw(now) == thaw(v):
                    continue
                effect = f"verl reads {target} instead, which is {_shown(now)} here: the run would go with that"
                fix = f"{'+' if now is MISSING else ''}{target}={_shown(v)}"
            else:
                effect = f"The run would go as with verl's default {_shown(default)}"
                fix = f"~{key}" if default is MISSING else f"{key}={_shown(default)}"
            if why.startswith(V1):
                fix = ALT.join([fix, "trainer.use_v1=false"])
            yield error(f"{key}={_shown(v)} is a key verl 0.9.1 never reads: {why}. {effect}, without a word", fix)


# -------------------------------------------------------------------------------------------------------- emulation


@rule("emulation", kind="emulation", phase="start-up")
def emulation(c: Ctx) -> Iterable[Problem]:
    try:
        done = emulate.emulate(c.verl, c.lab, c.environ)
    except emulate.EmulationError as e:
        yield error(str(e))
        return
    if done.settings is not None:
        yield note(emulate.describe(done))


@rule("emulation_torch", kind="emulation", phase="start-up", launching_only=True)
def emulation_torch(c: Ctx) -> Iterable[Problem]:
    try:
        if emulate.settings(c.lab) is None:
            return
    except emulate.EmulationError:
        return  # the rule above says what is wrong
    knows = emulate.torch_knows_fraction_key()
    if knows is None:
        yield note("emulation: no CUDA build of torch here, so whether its allocator knows "
                   "PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction was not checked")
    elif not knows:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("torch")
        except PackageNotFoundError:
            v = "?"
        yield error(f"emulation caps each worker with PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:..., but "
                    f"this torch ({v}) does not know that key: every worker would fail at its first CUDA allocation "
                    f"(\"Unrecognized CachingAllocator option\" / \"Unrecognized key\"). Install the torch "
                    f"verl[vllm]==0.9.1 pins (2.11: make setup), or run without emulation: "
                    f"lab.hardware.emulate.real_gpu_memory_gb=null")


# ------------------------------------------------------------------------------------------- the custom reward file


KEY = "reward.custom_reward_function"
BACK = "reward_fn=verl_default"  # the config-group choice back to verl's own scorer (conf/reward_fn/verl_default.yaml)
NEEDS = ("verl needs a number (int, float or bool) or a dict with a numeric 'score' (its other keys are logged, "
         "e.g. 'acc')")


def _cfg(c: Ctx) -> tuple[str | None, str, dict[str, Any]]:
    cfg = c.cfg.reward.custom_reward_function
    kwargs = cfg.get("reward_kwargs") or {}
    return cfg.get("path") or None, str(cfg.get("name") or ""), thaw(kwargs) if isinstance(kwargs, Mapping) else {}


def _raised_at(r: Mapping[str, Any]) -> str:
    at = (f" at {r['file_line']}" + (f": `{r['code']}`" if r.get("code") else "")) if r.get("file_line") else ""
    return at + (f" (raised in {r['raised_at']})" if r.get("raised_at") else "")


ROOT = str(facts.ROOT)


def _in_repo(f: str) -> list[str]:
    """The same file under the repository, when the path was made from the launch directory (a path written as
    ${hydra:runtime.cwd}/grpo_lab/tasks/rewards/...: launched from elsewhere, it points at nothing; the presets use
    ${lab_pkg:...} instead)."""
    cwd = os.getcwd()
    if not f.startswith(cwd + os.sep) or cwd == ROOT:
        return []
    there = os.path.join(ROOT, os.path.relpath(f, cwd))
    return [there] if os.path.isfile(there) else []


def _close_files(f: str) -> list[str]:
    folder, base = os.path.split(f)
    if not os.path.isdir(folder):
        return []
    names = [n for n in os.listdir(folder) if n.endswith(".py")]
    return [os.path.join(folder, n) for n in difflib.get_close_matches(base, names, n=2, cutoff=0.6)]


@rule("reward_fn_file", kind="reward", phase="reward")
def reward_fn_file(c: Ctx) -> Iterable[Problem]:
    path, name, kwargs = _cfg(c)
    if not path:
        return
    path = str(path)
    if not name:
        yield error(f"{KEY}.path={path} is set but {KEY}.name is empty: verl asserts a function name and its reward "
                    f"workers fail after Ray has started", f"{KEY}.name=compute_score")
        return
    f = reward_probe.file_of(path)
    if f is not None and not os.path.isfile(f):
        shown = path if path == f else f"{path} (from here: {f})"
        repo, near = _in_repo(f), _close_files(f)
        hint = f" Files with a close name there: {', '.join(near)}." if near else ""
        if repo:
            hint = (f" The path was made from the launch directory ({os.getcwd()}): the file is in the repository "
                    f"({repo[0]}); run from {ROOT}, or give the path.") + hint
        what = "is a folder, not a file" if os.path.isdir(f) else "does not exist"
        # back to verl's scorer: the preset, when another one set the path; `path=null` also when the path was
        # typed on the command line (it wins over any preset)
        back = ([BACK] if c.lab.reward_fn not in (None, "verl_default") else []) + [f"{KEY}.path=null"]
        yield error(f"the reward file {shown} {what}: verl's reward workers would fail with 'Custom module file not "
                    f"found' after Ray and the model have started.{hint} Point {KEY}.path at your file "
                    f"(python run.py {KEY}.path=/abs/path/to/reward.py), or go back to verl's own scorer by "
                    f"data_source ({' or '.join(back)})", ALT.join([f"{KEY}.path={p}" for p in repo + near] + back))
        return
    r = reward_probe.probe(path, name, kwargs, c.cfg.data.train_files)
    where = f or path
    stage = r.get("stage")
    if stage == "import":
        yield error(f"importing the reward file {where} (as verl's reward workers will) raised {r.get('type')}: "
                    f"{r.get('message')}{_raised_at(r)}. Fix the file; verl would fail the same way after Ray and the "
                    f"model have started ('Error loading module from ...')", "")
    elif stage == "name":
        found = r.get("callables") or []
        have = f"it defines: {', '.join(found)}" if found else "it defines no public function"
        what = f"is a {r['found']}, not a function" if r.get("found") else "is not defined"
        close = difflib.get_close_matches(name, found, n=1, cutoff=0.5)
        fixes = [f"{KEY}.name={n}" for n in close]
        fails = ("fail when they call it (TypeError: not callable)" if r.get("found") else
                 "fail with 'Object not found in module'")
        yield error(f"{KEY}.name={name}: `{name}` {what} in the reward file {where} ({have}); verl's reward workers "
                    f"would {fails}, after Ray and the model have started. Name the function verl calls "
                    f"(python run.py {KEY}.name=<function>) or define `{name}` in the file", ALT.join(fixes))
    elif stage == "timeout":
        yield warn(f"the reward file {where}: importing it and calling `{name}` on its sample answers did not finish "
                   f"within {r.get('timeout_s'):g} s, so it was not checked. verl calls it once per answer "
                   f"(train_batch_size x rollout.n per step): if it hangs there, training hangs at the first scoring")
    elif stage == "crash":
        yield error(f"the reward file {where}: the process that imported it and called `{name}` ended without a "
                    f"result (exit code {r.get('exit_code')}; a sys.exit/os._exit or a crash in the file?): "
                    f"{(r.get('stderr') or '')[-600:]}. verl's reward worker would die the same way", "")


def _fmt(x: Any) -> str:
    s = x if isinstance(x, str) else repr(x)
    return s if len(s) <= 120 else s[:117] + "..."


@rule("reward_fn_result", kind="reward", phase="reward")
def reward_fn_result(c: Ctx) -> Iterable[Problem]:
    path, name, kwargs = _cfg(c)
    if not path or not name:
        return  # nothing to probe: rule reward_fn_file says why
    f = reward_probe.file_of(str(path))
    if f is not None and not os.path.isfile(f):
        return
    r = reward_probe.probe(str(path), name, kwargs, c.cfg.data.train_files)
    if r.get("stage") not in ("call", "ok"):
        return
    where = f or str(path)
    sample = f"data_source={_fmt(r.get('data_source'))}, ground_truth={_fmt(r.get('ground_truth'))} " \
             f"({r.get('row_from')})"
    call = (f"{name}(data_source=..., solution_str=..., ground_truth=..., extra_info=..."
            + "".join(f", {k}=..." for k in kwargs) + ")")
    if r["stage"] == "call":
        hint, fix = "", ""
        unaccepted = [k for k in r.get("unaccepted") or [] if k in kwargs]
        if r.get("type") == "TypeError" and ("argument" in str(r.get("message")) or r.get("unaccepted")):
            hint = (f" verl calls it with keyword arguments only: {call}"
                    + (f" (from {KEY}.reward_kwargs: {', '.join(kwargs)})" if kwargs else "")
                    + "; give the function those parameters, or **kwargs"
                    + (f", or drop the reward_kwargs it does not take ({', '.join(unaccepted)}: a reward_fn preset's "
                       f"amounts stay when only the path is changed)" if unaccepted else "") + ".")
            if unaccepted and len(unaccepted) == len(r.get("unaccepted") or []):  # all of them reward_kwargs
                fix = " ".join(f"~{KEY}.reward_kwargs.{k}" for k in unaccepted)
        yield error(f"the reward function {where}:{name} raised {r.get('type')}: {r.get('message')}{_raised_at(r)}, "
                    f"called as verl will call it with the answer {_fmt(r.get('answer'))} on {sample}.{hint} Fix the "
                    f"function: in verl this fails the first step that meets such an answer", fix)
        return
    calls = r.get("calls") or []
    for call_ in calls:
        ans = _fmt(call_["answer"])
        if call_["is_dict"] and not call_["has_score"]:
            yield error(f"the reward function {where}:{name} returned a dict without 'score' for the answer {ans} "
                        f"({_fmt(call_['result'])}): verl's reward manager reads result['score'] (KeyError). {NEEDS}. "
                        f"Fix the function's return value", "")
            return
        if not call_["number"]:
            got = f"{call_['score_type']} as 'score'" if call_["is_dict"] else call_["type"]
            yield error(f"the reward function {where}:{name} returned {_fmt(call_['result'])} (a {got}) for the "
                        f"answer {ans} on {sample}: {NEEDS}; verl writes the score into a float tensor and fails "
                        f"there. Fix the function's return value, e.g. return float(score)", "")
            return
        if call_.get("finite") is False:
            yield error(f"the reward function {where}:{name} returned a score of {call_['score']} for the answer "
                        f"{ans}: a non-finite reward makes the group's advantages NaN and the update NaN. Fix the "
                        f"function so that every answer gets a finite score", "")
            return
    keys = {tuple(c_["keys"]) for c_ in calls if c_["is_dict"]}
    if len(keys) > 1:
        yield warn(f"the reward function {where}:{name} returns dicts with different keys for different answers "
                   f"({' vs '.join(str(list(k)) for k in sorted(keys))}): verl makes one column per key from the "
                   f"first answer's keys (with trainer.use_v1=false its agent loop raises KeyError on an answer "
                   f"that lacks one). Return the same keys for every answer")
    own = reward_probe.OWN_ANSWERS
    if r.get("answers_error"):
        yield warn(f"the reward file {where}: {r['answers_error']} on {sample}; the probe tried answers built from the "
                   f"row's ground truth instead. Make {own}(ground_truth, extra_info) return a list of answer texts "
                   f"(an empty list for a row that is not its task's)")
    if r.get("synthetic_row") and r.get("own_answers"):
        return  # the file shapes its answers to its own task, and this row is no row of it: equal scores say nothing
    scores = [c_["score"] for c_ in calls]
    if len(calls) > 1 and len(set(scores)) == 1:
        tried = ", ".join(_fmt(c_["answer"]) for c_ in calls)
        shaped = ("" if r.get("answers_from", "").startswith(own) else
                  f" If your task's answers have a shape of their own, define {own}(ground_truth, extra_info) in the "
                  f"file: it returns sample answers for a row (a right one, a wrong one, a malformed one) and the "
                  f"probe scores those (docs/tasks.md, 'Your own task')")
        yield warn(f"the reward function {where}:{name} gave every sample answer the same score {scores[0]:g} "
                   f"({tried}; answers {r.get('answers_from', 'built from the row')}; {sample}): if it scores all "
                   f"answers alike, every group's rewards are equal and GRPO's advantages are 0 (nothing is learned). "
                   f"Check that it can tell a right answer from a wrong one.{shaped}")


# ---- verl's own scorer: does it know the rows' data_source? ----------------------------------------------------------

# the sources grpo-lab's own generators write, and the reward_fn option that scores them
OURS = {"countdown": "reward_fn=countdown", "arith_": "reward_fn=strict_format"}


@per_file_version
def _file_sources(path: str) -> frozenset[str]:
    """The data_source values of one parquet file."""
    import pyarrow.parquet as pq  # ~0.15 s, only when a local parquet is there to read

    try:  # ParquetFile.read: read_table would import pyarrow.dataset and pandas (~0.25 s more)
        column = pq.ParquetFile(path).read(columns=["data_source"]).column(0)
        return frozenset(str(v) for v in column.unique().to_pylist())
    except Exception:  # unreadable, or no data_source column: rule data_files and verl say so
        return frozenset()


@rule("reward_fn_data_source", kind="reward", phase="reward")
def reward_fn_data_source(c: Ctx) -> Iterable[Problem]:
    path, _, _ = _cfg(c)
    if path or c.cfg.reward.reward_model.enable:
        return  # a custom reward file (rules above) or a reward model scores the rows
    files = [f for v in (c.cfg.data.train_files, c.cfg.data.val_files) for f in (facts.local_files(v) or [])]
    sources = set().union(*(_file_sources(f) for f in files if f.lower().endswith(".parquet") and os.path.isfile(f)))
    if not sources:
        return
    # the names and prefixes verl's default_compute_score dispatches on, read once per verl version from the function
    # itself (grpo_lab.verl_schema); any other raises NotImplementedError("Reward function is not implemented for
    # data_source=...") in the reward workers
    verl = schema()
    if verl.data_sources is None:  # verl's scorer could not be read: nothing to compare with
        return
    unknown = sorted(s for s in sources if not verl.knows_data_source(s))
    if not unknown:
        return
    fixes = sorted({fix for s in unknown for src, fix in OURS.items() if s == src or (src.endswith("_")
                                                                                    and s.startswith(src))})
    yield error(f"the data's data_source {', '.join(map(repr, unknown))} is not one verl's own scorer knows "
                f"(reward.custom_reward_function.path is null, so verl's default_compute_score scores every row, and "
                f"raises NotImplementedError for it in the reward workers, after start-up). Pick a reward_fn option "
                f"that scores it, or point {KEY}.path/name at a reward file of yours (docs/tasks.md, 'Your own task')",
                fixes[0] if len(fixes) == 1 else "")


# ---------------------------------------------------------------------------------------- from verl's issue tracker


def _env_on(c: Ctx, name: str) -> bool:
    """The variable is on (TRUE or 1) for verl's Ray workers (ray_init's env_vars) or here."""
    return str(c.cfg.env_vars.get(name) or c.environ.get(name)).upper() in ("TRUE", "1")


@rule("agent_loop_workers", kind="verl_issue", phase="rollout")
def agent_loop_workers(c: Ctx) -> Iterable[Problem]:
    """verl #6801 (docs/verl_issues.md): the legacy trainer splits a step's generation requests over the agent loop
    workers in equal parts (DataProto.chunk asserts it unless VERL_AUTO_PADDING is on); the V1 trainer does not."""
    if bool(c.cfg.trainer.use_v1) or _env_on(c, "VERL_AUTO_PADDING"):
        return
    tb, n = c.batch["train_batch_size"], c.batch["rollout_n"]
    workers = as_int(c.cfg.rollout.agent.num_workers, 8)
    if tb <= 0 or n <= 0 or workers <= 0:
        return
    size = tb * n + (tb if str(c.cfg.algorithm.adv_estimator) == "remax" else 0)  # REMAX adds a greedy baseline
    if size % workers:
        ok = divisor_le(size, workers)
        yield error(f"trainer.use_v1=false: verl 0.9.1's legacy trainer splits each step's {size} generation requests "
                    f"({tb} prompts x {n} answers) over actor_rollout_ref.rollout.agent.num_workers={workers} agent "
                    f"loop workers in equal parts, and {size}/{workers} = {size / workers:.2f}: it stops at the first "
                    f"generation with 'AssertionError: only support equal chunk. Got size of DataProto {size} and "
                    f"chunk {workers}' (verl #6801). The V1 trainer splits unequal parts",
                    ALT.join([f"{A}rollout.agent.num_workers={ok}", "trainer.use_v1=true"]))


@rule("ulysses_sequence_parallel", kind="verl_issue", phase="start-up")
def ulysses_sequence_parallel(c: Ctx) -> Iterable[Problem]:
    """verl #1226 (docs/verl_issues.md): the Ulysses SP size divides the attention (and key/value) heads and the GPUs,
    and needs use_remove_padding; verl checks each when it builds the actor, after Ray has started."""
    sp = sp_size(c.cfg)
    if sp <= 1:
        return
    # the key whose SP size verl uses: the deprecated actor.ulysses_sequence_parallel_size when above 1
    # (FSDPActorConfig.__post_init__ copies it over), else actor.fsdp_config.ulysses_sequence_parallel_size
    old, n_gpus = as_int(c.cfg.actor.ulysses_sequence_parallel_size, 1), c.batch["n_gpus"]
    key = A + ("actor." if old > 1 else "actor.fsdp_config.") + "ulysses_sequence_parallel_size"
    arch = c.model.arch
    heads, kv = (arch.num_attention_heads, arch.num_key_value_heads) if arch else (None, None)

    def splits_heads(s: int) -> bool:  # the attention heads, and the key/value heads (or they it); no model: yes
        return heads is None or (heads % s == 0 and (kv % s == 0 or s % kv == 0))

    good = max(s for s in range(1, sp + 1) if n_gpus % s == 0 and splits_heads(s))
    fix = f"{key}={good}"
    if n_gpus % sp:
        yield error(f"Ulysses sequence parallel size {sp} ({key}) does not divide the {n_gpus} GPUs: verl builds a "
                    f"(data parallel, {sp}) device mesh over them and torch refuses it when the actor is built", fix)
    elif not splits_heads(sp):
        what = (f"the model's {heads} attention heads" if heads % sp else
                f"the model's {kv} key/value heads (nor they it)")
        yield error(f"Ulysses sequence parallel size {sp} ({key}) does not divide {what}: verl 0.9.1 asserts "
                    f"'num_attention_heads {heads} must be divisible by ulysses_sp_size {sp}' (or the key/value form) "
                    f"when it builds the actor, after Ray has started (verl #1226; {arch.source})", fix)
    if not bool(c.cfg.model.use_remove_padding):
        yield error(f"Ulysses sequence parallel size {sp} with actor_rollout_ref.model.use_remove_padding=false: verl "
                    f"0.9.1 raises 'When using sequence parallelism (ulysses_sequence_parallel_size > 1), you must "
                    f"enable `use_remove_padding`' when it builds the actor", f"{A}model.use_remove_padding=true")


@rule("rollout_max_model_len", kind="verl_issue", phase="start-up")
def rollout_max_model_len(c: Ctx) -> Iterable[Problem]:
    """verl #673 (docs/verl_issues.md): above the model's max_position_embeddings (override_config's when set) the
    engine refuses to start; a prompt that leaves no room stops the run; below prompt + response, answers are cut."""
    if str(c.cfg.rollout.name) not in ("vllm", "sglang"):
        return
    arch = c.model.arch
    mpe = arch.max_position_embeddings if arch else None  # override_config's when set (rules.values resolve_model)
    mml = c.cfg.rollout.max_model_len
    if mml is None:  # verl then gives the engine the model's (overridden) limit
        mml = mpe
    if mml is None or isinstance(mml, bool):
        return
    mml = as_int(mml)
    prompt, resp = as_int(c.cfg.data.max_prompt_length), as_int(c.cfg.data.max_response_length)
    if mml <= 0 or prompt <= 0 or resp <= 0:
        return
    want = prompt + resp if not mpe else min(prompt + resp, mpe)
    # vLLM reads the model's own config.json for its limit; VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets it go above
    own = c.model.file_positions
    fix = f"{A}rollout.max_model_len={want}"
    if mpe and mml > mpe:
        where = (f"{A}model.override_config.max_position_embeddings" if position_override(c.cfg) else arch.source)
        yield error(f"actor_rollout_ref.rollout.max_model_len={mml} is above the model's max_position_embeddings "
                    f"({mpe}, {where}): verl 0.9.1 raises 'max_model_len ({mml}) should be less than or equal "
                    f"to max_position_embeddings ({mpe})' when the rollout engine starts, after Ray and the actor", fix)
    elif str(c.cfg.rollout.name) == "vllm" and own and mml > own and not _env_on(c, "VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        yield error(f"actor_rollout_ref.rollout.max_model_len={mml} is above the model's own max_position_embeddings "
                    f"({own}, its config.json): {A}model.override_config.max_position_embeddings="
                    f"{position_override(c.cfg)} reaches verl, not vLLM (verl 0.9.1 hands vLLM only quantization "
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
