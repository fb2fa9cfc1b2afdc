"""Rules on the batch arithmetic, the token budgets and the train file (the guide's "batch arithmetic")."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable
from typing import Any

from grpo_lab.checks.inputs import data_command, has_column, maker_for, parquet_columns
from grpo_lab.checks.rules import ALT, A, Ctx, Problem, error, note, rule, warn
from grpo_lab.facts import PROMPT_ROWS, local_files, prompt_lengths
from grpo_lab.memory.settings import as_int, mode, ref_used


def num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def padding_text(c: Ctx) -> str:
    """The V1 trainer's padding of this step, in words with the numbers."""
    pad = c.batch["padding"]
    if not pad or not pad["samples"]:
        return ""
    return (f"{c.batch['trajectories_per_step']} trajectories are padded with {pad['samples']} synthetic no-op samples "
            f"to {pad['padded_trajectories']} (a multiple of lcm(data-parallel GPUs, mini-batch x n) = "
            f"{pad['multiple']}): {pad['fraction']:.0%} of each step's samples are padding (short 128-token "
            f"sequences with zero reward and loss mask, verl/trainer/ppo/padding_utils.py "
            f"upsample_batch_to_divisible_size), {pad['updates_per_step']} actor update(s) per step")


def _sizes_ok(c: Ctx) -> bool:
    b = c.batch
    return b["train_batch_size"] > 0 and b["ppo_mini_batch_size"] > 0 and b["rollout_n"] > 0


# ---- one fix for the four batch rules: train batch and mini-batch chosen together --------------------------------

def batch_fix(tb: int, mini: int, n: int, dp: int, max_tb: int | None = None) -> tuple[int, int]:
    """(train batch, mini-batch) nearest to (tb, mini) with a whole number of updates per step and each mini-batch's
    trajectories splitting over the data-parallel GPUs (then the step's do too); about as many updates as before."""
    q = dp // math.gcd(dp, max(1, n))  # the mini-batch must be a multiple of q
    want = max(1, round(tb / mini)) if mini > 0 else 1
    hi = max(tb, mini, q) * 2 + q
    options = [(t, m) for m in range(q, hi + 1, q) for t in {tb, want * m}
               if t > 0 and t % m == 0 and (max_tb is None or t <= max_tb)]

    def cost(option: tuple[int, int]) -> float:
        t, m = option
        return abs(t // m - want) / want + abs(t - tb) / max(1, tb) + abs(m - mini) / max(1, mini)

    return min(options, key=cost, default=(tb, mini))  # the first of the cheapest, as a strict `<` kept it


def _batch_fix_text(c: Ctx, max_tb: int | None = None, split_over: int | None = None) -> str:
    b = c.batch
    tb, mini, n, dp = b["train_batch_size"], b["ppo_mini_batch_size"], b["rollout_n"], b["data_parallel_size"]
    t, m = batch_fix(tb, mini, n, split_over or dp, max_tb)
    parts = ([f"train_batch_size={t}"] if t != tb else []) + ([f"ppo_mini_batch_size={m}"] if m != mini else [])
    text = " ".join(parts)
    # or fewer GPUs on each node, with the batch as it is
    per_node, nnodes, sp = b["n_gpus_per_node"], b["nnodes"], b["sequence_parallel_size"]
    for k in range(per_node - 1, 0, -1):
        d = max(1, k * nnodes // sp)
        if (k * nnodes) % sp == 0 and (tb * n) % d == 0 and (mini * n) % d == 0 and tb % mini == 0 \
                and (max_tb is None or tb <= max_tb):
            text = (text + ALT if text else "") + f"ngpus_per_node={k}"
            break
    return text


def _legacy_share(c: Ctx) -> str:
    """Why the legacy trainer fails on a rank's share that is not whole mini-batches, with verl's own text."""
    b = c.batch
    traj, mt, dp = b["trajectories_per_step"], b["mini_batch_trajectories"], b["data_parallel_size"]
    where = ("TrainingWorker.train_mini_batch (verl/workers/engine_workers.py) cuts each data-parallel rank's share "
             "into mini-batches with tu.make_iterator (verl/utils/tensordict_utils.py), which asserts")
    if traj % dp or mt % dp:
        return f"nothing pads the step, and {where} that they are whole, at the first actor update"
    return (f"nothing pads the step, and {where} '{traj // dp} % {mt // dp} != 0' (each rank's {traj // dp} "
            f"trajectories against {mt // dp} per GPU per mini-batch) at the first actor update")


@rule("train_batch_vs_mini_batch", kind="batch", phase="update")
def train_batch_vs_mini_batch(c: Ctx) -> Iterable[Problem]:
    """verl #559, #1265. Without dynamic batching verl 0.9.1's validate_config refuses it (ActorConfig.validate,
    verl/workers/config/actor.py); with it the legacy trainer fails at the first update and the V1 trainer pads the
    step up to one mini-batch and runs (Mode)."""
    b = c.batch
    tb, mini = b["train_batch_size"], b["ppo_mini_batch_size"]
    if not (_sizes_ok(c) and tb < mini):
        return
    m, fix = mode(c.cfg), _batch_fix_text(c)
    what = f"the train batch ({tb} prompts) is smaller than the PPO mini-batch ({mini} prompts)"
    if not m.dyn:
        yield error(f"{what}. {m.name}: verl 0.9.1's validate_config raises 'ValueError: train_batch_size ({tb}) must "
                    f"be >= actor.ppo_mini_batch_size ({mini})' (verl/workers/config/actor.py ActorConfig.validate)",
                    fix)
    elif not m.v1:
        yield error(f"{what}. {m.name}: {_legacy_share(c)}", fix)
    else:
        yield warn(f"{what}: there is not one full update per step. {m.name} runs it: {padding_text(c)}", fix)


@rule("updates_per_step_integer", kind="batch", phase="update")
def updates_per_step_integer(c: Ctx) -> Iterable[Problem]:
    """A step that is not whole mini-batches: the V1 trainer pads it (with or without dynamic batching), the legacy
    trainer fails at the first update (Mode)."""
    b = c.batch
    tb, mini = b["train_batch_size"], b["ppo_mini_batch_size"]
    if not (_sizes_ok(c) and tb >= mini and tb % mini):
        return
    m, fix = mode(c.cfg), _batch_fix_text(c)
    what = (f"the train batch ({tb} prompts) is not a whole number of PPO mini-batches ({mini}): {tb}/{mini} = "
            f"{tb / mini:.2f} updates per step")
    if m.v1:
        yield warn(f"{what}. {m.name} runs it: {padding_text(c)}", fix)
    else:
        yield error(f"{what}. {m.name}: {_legacy_share(c)}", fix)


@rule("batch_divisibility", kind="batch", phase="update")
def batch_divisibility(c: Ctx) -> Iterable[Problem]:
    """verl #473, #606, #1004 ('only support equal chunk', 'real_train_batch_size must be divisible by minimal possible
    batch size'). Without dynamic batching verl 0.9.1's validate_config asserts train_batch_size x n % n_gpus (all the
    GPUs, sequence-parallel ones too: verl/utils/config.py); the legacy trainer splits the step in equal parts over
    the data-parallel ranks (ray_trainer.py _balance_batch: verl/utils/seqlen_balancing.py karmarkar_karp,
    equal_size); the V1 trainer with dynamic batching pads the step and runs (Mode)."""
    b = c.batch
    traj, dp, n_gpus = b["trajectories_per_step"], b["data_parallel_size"], b["n_gpus"]
    if not _sizes_ok(c):
        return
    m = mode(c.cfg)
    steps = f"{b['train_batch_size']} prompts x {b['rollout_n']} answers = {traj} trajectories per step do not split"
    if not m.dyn and traj % n_gpus:
        yield error(f"{steps} over all {n_gpus} GPUs ({traj}/{n_gpus} = {traj / n_gpus:.2f}). {m.name}: verl 0.9.1's "
                    f"validate_config asserts 'real_train_batch_size ({traj}) must be divisible by minimal possible "
                    f"batch size ({n_gpus})' over every GPU, sequence-parallel ones included (verl/utils/config.py "
                    f"validate_config)", _batch_fix_text(c, split_over=n_gpus))
    elif traj % dp:
        over = f"{steps} over the {dp} data-parallel GPUs ({traj}/{dp} = {traj / dp:.2f})"
        if m.v1:
            yield warn(f"{over}. {m.name} runs it: {padding_text(c)}", _batch_fix_text(c))
        else:
            said = (f"'number of items:[{traj}] < k_partitions:[{dp}]'" if traj < dp else f"'{traj} % {dp} != 0'")
            yield error(f"{over}. {m.name}: nothing pads the step; its _balance_batch splits it in equal parts over "
                        f"the data-parallel ranks and asserts {said} (verl/utils/seqlen_balancing.py; with "
                        f"trainer.balance_batch=false the dispatch's equal split asserts instead, "
                        f"verl/utils/tensordict_utils.py chunk_tensordict; older verl: 'only support equal chunk', "
                        f"verl #606)",
                        _batch_fix_text(c))


@rule("mini_batch_divisibility", kind="batch", phase="update")
def mini_batch_divisibility(c: Ctx) -> Iterable[Problem]:
    """The mini-batch must split over the data-parallel GPUs in every mode: verl 0.9.1's
    TrainingWorker.train_mini_batch (verl/workers/engine_workers.py) asserts mini_batch_size % dp == 0; the V1
    trainer's padding makes the step whole mini-batches, not the mini-batch a multiple of the GPUs."""
    b = c.batch
    mt, dp = b["mini_batch_trajectories"], b["data_parallel_size"]
    if _sizes_ok(c) and mt % dp:
        yield error(f"mini-batch {b['ppo_mini_batch_size']} x {b['rollout_n']} = {mt} trajectories do not split over "
                    f"the {dp} data-parallel GPUs ({mt}/{dp} = {mt / dp:.2f} per GPU): verl 0.9.1's "
                    f"TrainingWorker.train_mini_batch asserts 'Got mini_batch_size={mt} and "
                    f"self.engine.get_data_parallel_size()={dp}' at the first actor update "
                    f"(verl/workers/engine_workers.py), in either trainer, with or without dynamic batching (the V1 "
                    f"trainer's padding makes the step whole mini-batches, not the mini-batch whole GPUs)",
                    _batch_fix_text(c))


@rule("rollout_parallel", kind="memory", phase="rollout")
def rollout_parallel(c: Ctx) -> Iterable[Problem]:
    b = c.batch
    replica, n_gpus = b["rollout_replica_gpus"], b["n_gpus"]
    if replica > n_gpus or n_gpus % replica:
        tp = max(d for d in (1, 2, 4, 8) if n_gpus % d == 0 and d <= n_gpus)
        yield error(f"a vLLM replica spans tensor x data x pipeline parallel = {replica} GPUs, which does not divide "
                    f"the {n_gpus} GPUs: verl 0.9.1 asserts 'rollout world_size: {n_gpus} is not divisible by "
                    f"infer_world_size: {replica}' when it builds the rollout, after Ray and the actor have started "
                    f"(verl/workers/engine_workers.py; verl #1191)", f"rollout_tp={tp}")


def divisor_le(n: int, limit: int) -> int:
    return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


@rule("micro_batch", kind="batch", phase="update")
def micro_batch(c: Ctx) -> Iterable[Problem]:
    b = c.batch
    actor = c.cfg.actor
    if not _sizes_ok(c) or actor.use_dynamic_bsz:
        return
    dp = b["data_parallel_size"]
    per_gpu_mini = b["mini_batch_trajectories"] / dp
    micro, old = actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size

    def fix(limit: int) -> str:  # the largest micro-batch up to `limit` that splits a GPU's share of a mini-batch
        return f"ppo_micro_batch_size_per_gpu={divisor_le(max(1, int(per_gpu_mini)), limit)}"

    if old is not None:
        yield error(f"actor.ppo_micro_batch_size={old} is the deprecated global form; verl wants the per-GPU "
                    f"actor.ppo_micro_batch_size_per_gpu (performance sizes are local per GPU)",
                    f"~actor_rollout_ref.actor.ppo_micro_batch_size {fix(max(1, as_int(old) // dp))}")
        return
    if micro is None:
        yield error("dynamic batch size is off and actor.ppo_micro_batch_size_per_gpu is not set", fix(2))
        return
    micro = as_int(micro, None)
    if micro is None:
        return  # not a whole number: value_types names it
    if micro <= 0:
        yield error(f"actor.ppo_micro_batch_size_per_gpu={micro} must be positive", fix(2))
    elif micro > per_gpu_mini:
        yield error(f"the micro-batch ({micro} per GPU) is larger than the mini-batch's share of a GPU "
                    f"({num(per_gpu_mini)} trajectories): verl 0.9.1 asserts 'data size must be divisible by "
                    f"force_group_size * micro_batch_size_per_gpu' at the first update (verl/workers/engine/utils.py "
                    f"prepare_micro_batches; verl #405)", fix(micro))
    elif per_gpu_mini.is_integer() and int(per_gpu_mini) % micro:
        yield error(f"each GPU's {int(per_gpu_mini)} trajectories per mini-batch do not split into micro-batches of "
                    f"{micro}: verl 0.9.1 asserts 'data size must be divisible by force_group_size * "
                    f"micro_batch_size_per_gpu' at the first update (verl/workers/engine/utils.py)", fix(micro))
    if micro > 0 and per_gpu_mini.is_integer():
        b["micro_batches_per_update"] = int(per_gpu_mini) // micro


@rule("log_prob_micro_batch", kind="batch", phase="update")
def log_prob_micro_batch(c: Ctx) -> Iterable[Problem]:
    b = c.batch
    if not _sizes_ok(c):
        return
    pad = b.get("padding")  # the V1 trainer pads the step before the log-prob passes (Mode)
    per_gpu_step = (pad["padded_trajectories"] if pad else b["trajectories_per_step"]) / b["data_parallel_size"]
    for key, p in (("rollout", c.cfg.rollout), ("ref", c.cfg.ref)):
        if p.log_prob_use_dynamic_bsz or (key == "ref" and not ref_used(c.cfg)):
            continue
        micro, fix = p.log_prob_micro_batch_size_per_gpu, f"{A}{key}.log_prob_micro_batch_size_per_gpu="
        if micro is None:
            yield error(f"{key}.log_prob_use_dynamic_bsz is off and {key}.log_prob_micro_batch_size_per_gpu is not set",
                        fix + str(divisor_le(max(1, int(per_gpu_step)), 4)))
        elif per_gpu_step.is_integer() and int(per_gpu_step) % max(1, as_int(micro, 1)):
            padded = " (after the V1 trainer's padding)" if pad and pad["samples"] else ""
            yield error(f"each GPU's {int(per_gpu_step)} trajectories per step{padded} do not split into log-prob "
                        f"micro-batches of {micro} ({key}.log_prob_micro_batch_size_per_gpu): verl 0.9.1 asserts "
                        f"'data size must be divisible by force_group_size * micro_batch_size_per_gpu' in the first "
                        f"log-prob pass (verl/workers/engine/utils.py prepare_micro_batches)",
                        fix + str(divisor_le(int(per_gpu_step), as_int(micro, 1))))


# ---- the train file ---------------------------------------------------------------------------------------------

def data_files_of(c: Ctx) -> tuple[tuple[str, Any], ...]:
    """(key, value) of the train and validation files."""
    return ("data.train_files", c.cfg.data.train_files), ("data.val_files", c.cfg.data.val_files)


@rule("data_files", kind="batch", phase="start-up")
def data_files(c: Ctx) -> Iterable[Problem]:
    """Steps per epoch from the train file's row count; a file verl cannot read, or smaller than one batch: refused."""
    b = c.batch
    for key, value in data_files_of(c):
        files = local_files(value)
        for f in files or ():
            low = f.lower()
            if not os.path.isfile(f) or low.endswith((".json", ".jsonl")):
                continue  # not there (grpo_lab.checks.inputs says so), or json: verl reads it (datasets' json loader)
            footer = b""
            if low.endswith(".parquet"):
                with contextlib.suppress(OSError), open(f, "rb") as fh:  # unreadable or under 4 bytes: no footer
                    fh.seek(-4, os.SEEK_END)
                    footer = fh.read(4)
            if footer != b"PAR1":
                what = "has no parquet footer (PAR1)" if low.endswith(".parquet") else "is not a .parquet file"
                flag = "train_file" if "train" in key else "test_file"
                yield error(f"{key}: {f} {what}: verl's RLHFDataset reads .parquet (or .json/.jsonl) files and "
                            f"stops with 'Unsupported file format' after Ray has started",
                            f"point {flag} at a parquet file: `make data` writes data/gsm8k/train.parquet and "
                            f"test.parquet (python run.py {flag}=/path/to/file.parquet)")
    files = local_files(c.cfg.data.train_files)
    if files is None:
        yield note("data.train_files is remote: steps per epoch unknown until verl reads it")
        return
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:  # a missing file is grpo_lab.checks.inputs' to report (with the command that makes it)
        cmds = [m for m in dict.fromkeys(maker_for(f, c.lab.dataset.name) for f in missing) if m]
        yield note(f"train file not there yet ({', '.join(missing)}): steps_per_epoch unknown"
                   + (f"; `{'`, `'.join(cmds)}` writes it" if cmds else ""))
        return
    if not all(f.lower().endswith(".parquet") for f in files):
        yield note("steps per epoch unknown: the train file is not parquet (its rows are not counted here)")
        return
    rows, tb = b["train_rows"], b["train_batch_size"]
    if rows is not None and 0 < tb and rows < tb:
        yield error(f"the train file has {rows} rows, fewer than one train batch ({tb}): verl's dataloader "
                    f"(drop_last) yields no step", _batch_fix_text(c, max_tb=rows))


@rule("data_columns", kind="batch", phase="start-up")
def data_columns(c: Ctx) -> Iterable[Problem]:
    """The columns the composed config reads, in each parquet file's schema (no rows read)."""
    # (column, what reads it) for each column verl reads from every row of the data files
    prompt, reward_key = str(c.cfg.data.prompt_key), str(c.cfg.data.reward_fn_key)
    need = [(prompt, "data.prompt_key: the chat messages verl's RLHFDataset tokenizes"),
            ("data_source", "data.reward_fn_key: the reward key, verl's reward picks its scorer by it" if
             reward_key == "data_source" else f"the reward key: verl 0.9.1's reward loop reads data_source whatever "
                                              f"data.reward_fn_key={reward_key} says")]
    if not c.cfg.reward.reward_model.enable:
        need.append(("reward_model.ground_truth", f"what reward_fn={c.lab.reward_fn or 'verl_default'} scores "
                                                  f"each answer against"))
    for key, value in data_files_of(c):
        for f in local_files(value) or ():
            cols = parquet_columns(f) if f.lower().endswith(".parquet") else None
            if cols is None:
                continue  # not there, or not parquet: rule data_files and grpo_lab.checks.inputs say so
            missing = [(col, why) for col, why in need if not has_column(cols, col)]
            if not missing:
                continue
            top = sorted(x for x in cols if "." not in x)
            fixes = ["data.prompt_key=prompt" for col, _ in missing[:1] if col == need[0][0] and "prompt" in cols]
            cmd, then = data_command(f, c.lab.dataset.name, cols)
            lacks = " (this file has no answer column: the reward needs each row's answer)" if "question" in cols \
                and "answer" not in cols else ""
            fixes.append(f"`{cmd}` writes files with these columns{lacks}" + (f", then: {then}" if then else ""))
            yield error(f"{key}: {f} has no column {', no '.join(f'{col} ({why})' for col, why in missing)}; "
                        f"its columns: {', '.join(top) or 'none'}. verl fails on the first batch, after Ray has "
                        f"started", ALT.join(fixes))


@rule("prompts_too_long", kind="batch", phase="start-up")
def prompts_too_long(c: Ctx) -> Iterable[Problem]:
    """verl 0.9.1's RLHFDataset drops each prompt longer than max_prompt_length under the chat template
    (filter_overlong_prompts, utils/dataset/rl_dataset.py); measured here when the tokenizer and the files are local."""
    data = c.cfg.data
    limit, files = as_int(data.max_prompt_length, 0), local_files(data.train_files) or ()
    tok = str(c.cfg.model.tokenizer_path or c.cfg.model.path or "")
    if limit <= 0 or not files or not data.filter_overlong_prompts:
        return
    lengths = prompt_lengths(tok, tuple(files), str(data.prompt_key), dict(data.apply_chat_template_kwargs))
    if not lengths or (over := sum(n > limit for n in lengths)) == 0:
        return
    what = (f"max_prompt_length={limit}: {over} of the first {len(lengths)} training prompts (at most {PROMPT_ROWS} "
            f"read) are longer under {tok}'s chat template ({min(lengths)}-{max(lengths)} tokens), and verl's "
            f"filter_overlong_prompts drops them when it loads the data")
    if over == len(lengths):
        yield error(f"{what}: every one, so no row is left and verl stops with 'Train dataloader is empty!' after Ray "
                    f"has started", f"max_prompt_length={max(lengths)}")
    else:
        yield warn(f"{what} ({over / len(lengths):.0%} of them)", f"max_prompt_length={max(lengths)}")


# ---- token budgets ----------------------------------------------------------------------------------------------

def _budget_checks(c: Ctx) -> list[tuple[str, bool, str, int, str, str]]:
    """(pass, dynamic batching on, its token budget's key and size, the key of its fix, what it is) of each pass."""
    actor = c.cfg.actor
    checks = [("actor", bool(actor.use_dynamic_bsz), "actor.ppo_max_token_len_per_gpu",
               as_int(actor.ppo_max_token_len_per_gpu), "ppo_max_token_len_per_gpu", "the actor update")]
    for name, p, what in (("rollout", c.cfg.rollout, "the old-log-prob pass"),
                          ("ref", c.cfg.ref, "the reference log-prob pass")):
        key = f"{name}.log_prob_max_token_len_per_gpu"
        if name == "rollout" or ref_used(c.cfg):
            checks.append((name, bool(p.log_prob_use_dynamic_bsz), key, as_int(p.log_prob_max_token_len_per_gpu),
                           A + key, what))
    return checks


@rule("token_budget", kind="batch", phase="update")
def token_budget(c: Ctx) -> Iterable[Problem]:
    """Dynamic batching packs up to max_token_len_per_gpu x Ulysses SP size tokens per micro-batch: verl 0.9.1,
    verl/workers/engine/utils.py prepare_micro_batches (`max_token_len = max_token_len_per_gpu * sp_size`)."""
    b = c.batch
    seq, sp = b["sequence_length"], b["sequence_parallel_size"]
    budgets = {}
    for name, dyn, key, budget, override, what in _budget_checks(c):
        if not dyn:
            continue
        budgets[name] = budget
        if budget * sp < seq:
            need = math.ceil(seq / sp)
            with_sp = f" x Ulysses SP {sp} = {budget * sp}" if sp > 1 else ""
            yield error(f"{A}{key}={budget}{with_sp} cannot hold one full sequence of max_prompt_length + "
                        f"max_response_length = {seq} tokens: verl asserts max_token_len >= the longest sequence, so "
                        f"{what} fails the first time a long answer appears (mid-run)", f"{override}={need}")
    b["token_budgets"] = budgets
    if "actor" in budgets and isinstance(b["trajectories_per_gpu"], int):
        per_gpu_tokens = b["trajectories_per_gpu"] * seq
        b["max_tokens_per_gpu_per_update"] = per_gpu_tokens
        b["micro_batches_per_update_max"] = math.ceil(per_gpu_tokens / max(1, budgets["actor"] * sp))


@rule("token_budget_advice", kind="batch", phase="update")
def token_budget_advice(c: Ctx) -> Iterable[Problem]:
    seq, sp = c.batch["sequence_length"], c.batch["sequence_parallel_size"]
    for _, dyn, key, budget, _, _ in _budget_checks(c):
        if dyn and seq <= budget * sp < 2 * seq:
            yield note(f"{key}={budget} is below 2 x (prompt + response) = {2 * seq}: verl's tuning guide advises "
                       f"ppo_max_token_len_per_gpu >= 2 x (max_prompt_length + max_response_length) so that a "
                       f"micro-batch packs at least two full sequences (the official script's 3000 is a cautious "
                       f"choice on 32 GB cards; raise it if memory allows)")
