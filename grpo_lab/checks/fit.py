"""Fit: find the settings that make every phase of a config fit its cards, without changing what is trained.

    python run.py preflight.fit=true model=qwen3_4b hardware=rtx4080_16gbx4    # = make fit ARGS="..."
    python run.py preflight.fit_write=my_4b model=qwen3_4b hardware=...        # also saves conf/experiment/my_4b.yaml

Where it lives: this module is the entry point (`fit`, `fit_job`: the search, its re-check by the preflight, the
command line and the saved experiment); the moves are grpo_lab/memory/fit_moves.py, how a setting is judged, the search
and what would fit when nothing does grpo_lab/memory/fit_search.py, the costs in words and the printed result
grpo_lab/checks/fit_text.py.

The moves in the guide's order, what "fits" means and the search: docs/memory_plan.md.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
import shlex
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import yaml

from grpo_lab.checks.fit_text import FitResult, Step, cost_words, format_result
from grpo_lab.checks.rules import memory_ids  # the rules the fit is here to clear: those of kind "memory"
from grpo_lab.cli.apply import apply_overrides
from grpo_lab.cli.apply import groups as _conf_groups
from grpo_lab.memory import engines
from grpo_lab.memory.fit_moves import (
    CONF,
    MARGIN,
    MOVES,
    PHASES,
    RANK,
    REQUIRED,
    SPEED_MOVES,
    move_title,
)
from grpo_lab.memory.fit_search import FitContext, State, choose, faster, way_out
from grpo_lab.memory.run import Run
from grpo_lab.memory.settings import one_sequence, settings_after, spelled
from grpo_lab.verl_keys import put as _put

# ---- the fit: search, then the preflight on its result -----------------------------------------------------------

FASTER = 0.10  # a setting must be this much faster by the time plan to win over one earlier in the guide's order
SPEED_IDS = {mid for mid, _, _ in SPEED_MOVES}


class FitError(Exception):
    """The fit cannot run on this config (no architecture facts, no card size): the message says why."""


def fit(run: Run, *, cfg: Any = None) -> FitResult:
    """Search the settings that make every phase of the job's Run fit; verify the result with the preflight."""
    from grpo_lab.checks.preflight import run_preflight
    from grpo_lab.verl_schema import schema

    environ, verl = run.environ, run.verl
    lab = copy.deepcopy(run.lab)
    lab.preflight.strict = True
    run = replace(run, lab=lab)
    arch = run.model.arch  # the model the preflight plans
    if arch is None:
        raise FitError("no architecture facts for this model (no local config.json, no lab.model): nothing to plan. "
                       "Pick a model group (model=qwen3_1_7b) or point model_path at a folder with its config.json")
    s0 = run.settings
    if s0 is None:
        raise FitError("the preflight names values that are not numbers: nothing to plan until they are (" +
                       "; ".join(run.notes) + ")")
    name = s0.rollout_engine or "vllm"
    if str(name).lower() not in engines.ENGINES:  # the memory plan has not been measured with this engine
        names = schema().rollout_servers
        either = (f"; verl 0.9.1 cannot start it either (it knows {', '.join(sorted(names))})"
                if names and name not in names else "")
        raise FitError(f"rollout engine {name!r}: the memory plan has not been measured with it (it knows how "
                       f"{' and '.join(engines.ENGINES)} use gpu_memory_utilization){either}, so there is nothing to "
                       f"search. Pick one it knows: actor_rollout_ref.rollout.name=vllm (or rollout=sglang_tp1_mem04)")
    if s0.card_gb <= 0:
        raise FitError("lab.hardware.gpu_memory_gb is not set: the fit needs the card's size. Pick a hardware option "
                       "(hardware=rtx4080x4) or set it: lab.hardware.gpu_memory_gb=24")
    base_report = run_preflight(run, launching=False)
    budgets = one_sequence(s0)  # token budgets below one sequence: raised first, the fit's own required move
    s_req = settings_after(s0, budgets, lab.set_apart)  # what the search starts from and plans "before"
    ctx = FitContext(arch, s0, lab, mini=int(run.cfg.actor.ppo_mini_batch_size or 0),
                     ref_offload=run.cfg.ref.fsdp_config.param_offload, shape=run.shape)
    blocked = [f"[{p.rule}] {p.message}" + (f"\n      fix: {p.fix}" if p.fix else "")
               for p in base_report.errors if p.rule not in memory_ids() and not (p.rule == "token_budget" and budgets)]
    valid_util = 0.0 < s0.gpu_memory_utilization < 1.0
    before = ctx.plan(s_req if valid_util else replace(s_req, gpu_memory_utilization=0.4))
    res = FitResult(before, blocked=blocked, title=base_report.title, card_gb=s0.card_gb, host_ram_gb=s0.host_ram_gb,
                    batch=run.batch_shape)
    if blocked:
        return res

    found = choose(ctx, budgets, FASTER)
    chosen = found.chosen
    res.faster_than = found.faster_than
    if found.guide_first is not None:
        res.guide_first = ([c.override for c in spelled(found.guide_first.values, cfg)],
                           ctx.step_s(found.guide_first.s))
    if valid_util:
        res.time_before = ctx.time(s_req)
    if chosen is None or found.best is None:
        # full fine-tuning (or this LoRA setup) cannot fit: say what would
        res.way_out = way_out(ctx, s_req, run.cfg, lora_fits=found.lora_best, lora_chosen=chosen is not None)
    res.rejected = _rejected(ctx, found.start, chosen, found.states)
    res.evaluations = ctx.evaluations
    if chosen is None:
        return res

    # then the same algorithm in a shorter step, where it still fits (verl has no fused log-prob beside sum(pi^2))
    skip = ({"fused": "verl 0.9.1 has no fused path for actor.calculate_sum_pi_squared (rule fused_sum_pi_squared)"}
            if run.cfg.actor.calculate_sum_pi_squared else {})
    chosen, slower = faster(ctx, chosen, FASTER, skip)
    res.rejected += slower
    res.ok, res.lora, res.values = True, chosen.lora, dict(chosen.values)
    res.after = ctx.plan(chosen.s)
    res.time_after = ctx.time(chosen.s)
    changes = _changes(ctx, chosen, cfg)
    res.changes = [c for c in changes if c.move not in SPEED_IDS]
    res.speedups = [c for c in changes if c.move in SPEED_IDS]
    res.overrides = [o for c in changes for o in c.overrides]
    # verify: the overrides on the verl config, the plan's settings from it, and the whole preflight on it
    after = Run.build(*apply_overrides(verl, lab, chosen.values), environ)
    s2 = after.settings
    if s2 != chosen.s:
        diff = [f.name for f in fields(chosen.s) if getattr(s2, f.name, None) != getattr(chosen.s, f.name)]
        res.verify_problems.append(f"the overrides do not give the settings the search planned ({', '.join(diff)})")
    report = run_preflight(after, launching=False)
    res.verify_problems += [f"[{p.rule}] {p.message}" for p in report.errors]
    res.warnings = [f"[{p.rule}]" for p in report.warnings]
    if after.batch_shape != res.batch:
        res.verify_problems.append(f"the batch arithmetic changed: {res.batch} -> {after.batch_shape}")
    res.ok = res.verified = not res.verify_problems
    return res


def _changes(ctx: FitContext, chosen: State, cfg: Any) -> list[Step]:
    """Each move of the chosen state in the order applied, with its overrides, its cost and a one-line reason."""
    later: set[str] = set()
    out = []
    for mid, vals, s_before, s_after in reversed(chosen.history):  # a key set twice keeps its last value only
        keep = {k: v for k, v in vals.items() if k not in later}
        later |= set(vals)
        if not keep:
            continue
        e0, e1 = ctx.eval(s_before), ctx.eval(s_after)
        title = move_title(mid)
        lowered = [f"{ph.replace('_', ' ')} {e0.peaks[ph]:g} -> {e1.peaks[ph]:g} GB" for ph in PHASES
                   if abs(e0.peaks[ph] - e1.peaks[ph]) >= 0.01]
        cost = cost_words(ctx, mid, s_before, s_after)
        if mid in SPEED_IDS:
            faster_by = f"a step {ctx.step_s(s_before):.0f} -> {ctx.step_s(s_after):.0f} s by the time plan"
            cost, reason = f"{cost}; {faster_by}", f"{title}: {faster_by}" + "".join(f"; {x}" for x in lowered)
        else:
            reason = f"{title}: " + (", ".join(lowered) if lowered else "lets vLLM start (room for its KV cache)")
        out.append(Step(mid, title, spelled(keep, cfg, reason), cost))
    return out[::-1]


def _rejected(ctx: FitContext, start: State, chosen: State | None, found: list[State]) -> list[str]:
    """Why each move the chosen command does not use was left out."""
    out = []
    used = set(chosen.moves) if chosen else set()
    top = max((RANK[m] for m in used if m not in ("max_model_len", *REQUIRED)), default=-1)
    e0 = start.e
    missing = [ph for ph in PHASES if e0.verdicts[ph] not in ("fits", "unknown")]
    for m in MOVES:
        if m.id in used:
            continue
        r = m.choose(ctx, start.s)
        alt = next((f for f in found if m.id in f.moves and f is not chosen), None)
        if alt is not None:
            names = " + ".join(move_title(x) for x in alt.moves)
            worst = max(alt.moves, key=lambda x: RANK[x])
            why = (f"uses {move_title(worst)}, later in the guide's order" if RANK[worst] > top
                   else "needs more changes")
            out.append(f"{m.title}: also fits as {names}; not taken: {why}")
        elif isinstance(r, str):
            out.append(f"{m.title}: {r}")
        elif chosen is not None:
            out.append(f"{m.title}: not needed")
        else:
            e1 = ctx.eval(r[1])
            effect = ", ".join(f"{ph.replace('_', ' ')} {e0.peaks[ph]:g} -> {e1.peaks[ph]:g} GB" for ph in missing
                               if abs(e0.peaks[ph] - e1.peaks[ph]) >= 0.01)
            out.append(f"{m.title}: not enough" + (f" ({effect})" if effect else
                                                   " (no effect on the phases that do not fit)"))
    if chosen is not None and not chosen.lora and start.s.lora_rank == 0:
        out.append("LoRA: not needed, full fine-tuning fits (LoRA would change what is trained)")
    return out


# ---- the command line and the saved experiment -------------------------------------------------------------------

_FIT_KEYS = ("preflight.fit", "preflight.fit_write", "preflight.fit_overwrite")


def _user_args(args: list[str]) -> list[str]:
    return [a for a in args if a.split("=")[0].lstrip("+~") not in _FIT_KEYS]


def fitted_args(args: list[str], overrides: list[str]) -> list[str]:
    """The user's args (less the fit's own keys, less those the fit sets again) followed by the fit's overrides."""
    new = {o.split("=")[0] for o in overrides}
    kept = [a for a in _user_args(args) if a.split("=")[0].lstrip("+~") not in new]
    return kept + list(overrides)


def command_line(args: list[str]) -> str:
    return "python run.py " + " ".join(shlex.quote(a) for a in args)


def experiment_yaml(name: str, args: list[str], res: FitResult, *, made_by: str) -> str:
    """conf/experiment/<name>.yaml: header, the user's group choices as `override /group`, their values, the fit's."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups = _conf_groups()
    parsed = OverridesParser.create().parse_overrides(_user_args(args))
    defaults: list[str] = []
    tree: dict[str, Any] = {}  # the values to write, the user's first
    comments: dict[str, str] = {}
    for o in parsed:
        key = o.key_or_group
        if o.is_delete():
            raise ValueError(f"{o.input_line} deletes a key: a config file cannot say that; keep it on the command "
                             f"line: python run.py experiment={name} {o.input_line}")
        if key.startswith(("hydra.", "preflight.")):
            continue
        if key == "experiment" and key in groups:
            defaults.insert(0, f"  - {o.value()}")
        elif key in groups:
            defaults.append(f"  - override /{key}: {o.value()}")
        else:
            _put(tree, key, o.value())
            comments[key] = "from the command line"
    a = res.after or {}
    lines = ["# @package _global_",
             f"{FITTED} on {dt.date.today().isoformat()}: every phase below {int(MARGIN * 100)}% of the "
             f"{res.card_gb:g} GB cards ({res.title}).",
             f"#   python run.py experiment={name}",
             f"# made with: {made_by}",
             "# predicted peak per GPU (grpo_lab/memory/memplan.py), before -> after:"]
    for ph in ("generation", "training", "weight_sync"):
        lines.append(f"#   {ph.replace('_', ' ')}: {res.before['phases'][ph]['peak_gb_per_gpu']} GB "
                     f"{res.before['verdict'][ph]} -> {a['phases'][ph]['peak_gb_per_gpu']} GB {a['verdict'][ph]}")
    lines.append(f"#   host RAM: {res.before['host_ram']['total_gb']} GB -> {a['host_ram']['total_gb']} GB")
    if res.lora:
        lines.append("# LoRA: full fine-tuning does not fit these cards; this trains adapters "
                     "(what is trained changes)")
    lines += ["defaults:", *defaults, "  - _self_", ""]
    for step in [*res.changes, *res.speedups]:
        for i, c in enumerate(step.changes):
            _put(tree, c.key, c.value)
            comments[c.key] = c.reason if i == 0 else f"{step.title}, with {step.changes[0].key}"
    lines += _emit_tree(tree, comments, "", 0)
    return "\n".join(lines) + "\n"


def _emit_tree(tree: dict[str, Any], comments: dict[str, str], prefix: str, depth: int) -> list[str]:
    out = []
    pad = "  " * depth
    for k, v in tree.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and path not in comments:
            out.append(f"{pad}{k}:")
            out += _emit_tree(v, comments, path + ".", depth + 1)
            continue
        if path in comments:
            out.append(f"{pad}# {comments[path]}")
        dumped = yaml.safe_dump({k: v}, default_flow_style=True, width=10_000).strip()
        out.append(pad + dumped[1:-1] if dumped.startswith("{") else pad + dumped)
    return out


FITTED = "# Fitted by grpo_lab/checks/fit.py"  # the mark of a file make fit wrote (and may replace)


def experiment_path(name: Any, *, overwrite: bool) -> Path:
    """conf/experiment/<name>.yaml, after checking the name and that it may be written."""
    name = str(name)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name or ""):
        good = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_-") or "my_fit"
        raise ValueError(f"preflight.fit_write={name!r}: a name of letters, digits, '_' and '-' (it becomes "
                         f"conf/experiment/<name>.yaml): preflight.fit_write={good} (make fit ... WRITE={good})")
    path = CONF / "experiment" / f"{name}.yaml"
    if path.exists() and FITTED not in path.read_text()[:200]:  # the repository's own (or the user's own) experiment
        raise FileExistsError(f"{path} is not a file make fit wrote, and make fit never replaces it: write another "
                              f"name, preflight.fit_write={name}_fit (make fit ... WRITE={name}_fit)")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists (make fit wrote it): pick another name, or replace it with "
                              f"preflight.fit_overwrite=true (make fit ... WRITE={name} OVERWRITE=1)")
    return path


def fit_job(cfg: Any, run: Run, job_dir: Path) -> str:
    """The `preflight.fit=true` branch of a job (grpo_lab/launch/job.py): search, print, maybe save; never launches."""
    from hydra.core.hydra_config import HydraConfig

    from grpo_lab.errors import GrpoLabError
    from grpo_lab.facts import atomic_write, write_json

    args, lab = list(HydraConfig.get().overrides.task), run.lab
    name = lab.preflight.fit_write
    if name:  # a bad name or an existing file: refuse before searching, nothing written
        try:
            experiment_path(name, overwrite=lab.preflight.fit_overwrite)
        except (ValueError, FileExistsError) as e:
            raise GrpoLabError(f"fit: {e}") from None
    try:
        res = fit(run, cfg=cfg)
    except FitError as e:
        raise GrpoLabError(f"fit: {e}") from None
    final = fitted_args(args, res.overrides)
    cmd = command_line(final)
    print(format_result(res, cmd))
    write_json(job_dir / "fit.json", {"ok": res.ok, "lora": res.lora, "overrides": res.overrides,
                                       "command": cmd if res.ok else None, "before": res.before, "after": res.after,
                                       "way_out": res.way_out, "rejected": res.rejected,
                                       "verify_problems": res.verify_problems, "blocked": res.blocked})
    if res.blocked:
        raise GrpoLabError(f"fit: {len(res.blocked)} problem(s) above are not about memory; fix them first "
                           f"(nothing was written or started).")
    if not res.ok:
        if res.after is not None:
            raise GrpoLabError("fit: the fitted config did not pass the preflight (above); no command is given.")
        raise GrpoLabError("fit: nothing tried fits these cards; what would is listed above under 'What would fit'.")
    if name:
        try:
            text = experiment_yaml(str(name), args, res, made_by=command_line(args))
            path = atomic_write(experiment_path(name, overwrite=lab.preflight.fit_overwrite), text)
        except (ValueError, FileExistsError) as e:
            raise GrpoLabError(f"fit: not saved: {e}") from None
        print(f"\nsaved: {path.relative_to(CONF.parent)}; run it with: python run.py experiment={name}")
    else:
        print("\nsave it as conf/experiment/<name>.yaml: add preflight.fit_write=<name> (make fit ARGS=\"...\" "
              "WRITE=<name>)")
    return "fitted"
