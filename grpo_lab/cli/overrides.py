"""The command line, parsed once: Hydra's own flag parser and override grammar, checked against the config groups and
keys. What it knows, what it refuses (and why), and verl's own tree: docs/cli.md."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import os
import shlex
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab import facts
from grpo_lab.cli.config import unsafe_name
from grpo_lab.cli.knobs import KNOBS, SHORT_KEYS, misspelt_env
from grpo_lab.labconf import LabConf, Preflight
from grpo_lab.verl_keys import lookup, merge
from grpo_lab.verl_schema import schema, verl_cache
from grpo_lab.verl_schema.hydra_internals import args_parser, sweep_jobs
from grpo_lab.verl_schema.verl_paths import verl_config_dir

CONF_DIR = facts.CONF
# names that are close enough to a real one to be a typo, when adding a key is otherwise legal
NEAR_MISS = 0.8


class OverrideError(ValueError):
    """A command line grpo-lab refuses before composing; the message names the mistake and the fix."""


@dataclass
class CommandLine:
    args: list[str]                 # as typed, without the program name
    flags: argparse.Namespace       # Hydra's own flags (--cfg, -m, ...), parsed by Hydra's own parser
    overrides: list[Any]            # hydra.core.override_parser.types.Override: the command line's
    env: list[str] = field(default_factory=list)          # overrides from the environment's knobs
    env_names: dict[str, str] = field(default_factory=dict)  # override -> the environment variable it came from
    warnings: list[str] = field(default_factory=list)  # a value given twice (given_twice), one line each

    @property
    def argv(self) -> list[str]:
        """What Hydra gets: the command line, then the environment's knobs."""
        return self.args + self.env

    def sweep_points(self) -> int | None:
        """How many jobs Hydra's basic sweeper makes of these overrides (None: a sweep it cannot count here)."""
        try:
            return sweep_jobs([*self.overrides, *parse_overrides(self.env)])
        except Exception:  # noqa: BLE001 - Hydra refuses it itself, with its own message
            return None

    @property
    def only_prints(self) -> bool:
        """Hydra only prints (--cfg, --info, --help, --hydra-help): no job runs, so no run folder is made."""
        return any(getattr(self.flags, flag, None) for flag in ("cfg", "info", "help", "hydra_help"))


# ---------------------------------------------------------------------------------------------------------------
# parsing


def parse_overrides(overrides: Sequence[str]) -> list[Any]:
    """Hydra's parse of override strings; a syntax error becomes an OverrideError."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as e:
        raise OverrideError(f"{e} (quote a value with spaces or commas: key='a b,c')") from None


def parse(args: Sequence[str], environ: Mapping[str, str] | None = None, *, flags: bool = True) -> CommandLine:
    """The command line (flags and overrides) plus the environment's knobs. environ=None: no knobs from it."""
    # Hydra's own argument parser (the one @hydra.main uses) splits its flags from the override strings
    ns = args_parser().parse_args(list(args)) if flags else argparse.Namespace()
    texts = list(ns.overrides or []) if flags else list(args)
    cli = CommandLine(args=list(args), flags=ns, overrides=parse_overrides(texts))
    if environ is not None:
        for knob in KNOBS:
            value = environ.get(knob.env)
            if value is None or value == "":
                continue
            over = [o for o in cli.overrides if o.key_or_group in (knob.key, knob.verl_key) and not o.is_delete()]
            if over:
                wins = ([o for o in over if o.key_or_group == knob.verl_key] or over)[-1]
                cli.warnings.append(f"{knob.env}={value} in the environment is ignored: the command line sets the "
                                    f"same value, and its {wins.input_line} wins")
                continue
            # read as the official script's `key=$VAR` reads it (0.5 a number, [a,b] a list; with -m a sweep, as the
            # short key would sweep), except that a syntax error is one quoted string
            kind = _reads_as(value)[0]
            if kind == "sweep" and not getattr(ns, "multirun", False):
                (o,) = parse_overrides([f"{knob.key}={value}"])
                raise OverrideError(f"{knob.env}={value} is a list of values, which only a sweep takes (Hydra's -m): "
                                    f"{knob.env}={shlex.quote(value)} {_with_m(cli.args)} (the same as: "
                                    f"{_with_m(cli.args, f'{knob.key}={value}')}){_not_a_sweep(o, knob.env, env=True)}")
            text = f"{knob.key}={quote(value) if kind == 'error' else value}"
            cli.env.append(text)
            cli.env_names[text] = knob.env
    cli.warnings += given_twice(cli.overrides)
    return cli


def _with_m(args: Sequence[str], *extra: str) -> str:
    return " ".join(["python run.py -m", *(shlex.quote(a) for a in args), *extra])


def _not_a_sweep(o: Any, name: str, env: bool) -> str:
    """For values that are not all numbers: how to write one value holding a comma, or a list (as typed)."""
    values = _sweep_values(o) or []
    if values and all(isinstance(v, (int, float)) for v in values):
        return ""
    value = _value_text(o)
    one, many = (f"{name}=\"'{value}'\"", f"{name}=[{value}]") if env else \
        (f"\"{name}='{value}'\"", f"'{name}=[{value}]'")
    return f"; for one value that holds a comma, quote it: {one}; for a list: {many}"


def _check_dict_value(o: Any) -> None:
    """key={a: 1} merges into verl's node key by key, and Hydra refuses a key the node does not hold."""
    if o.is_add() or o.is_force_add() or o.is_delete() or o.is_sweep_override() or not isinstance(o.value(), dict):
        return
    node = lookup(verl_tree(), o.key_or_group)
    new = [str(k) for k in o.value() if isinstance(node, dict) and "_target_" not in node and k not in node]
    if new:
        raise OverrideError(f"{o.input_line}: Hydra merges the dict into {o.key_or_group}, which has no "
                            f"{', '.join(new)}, and refuses it; write {shlex.quote('++' + o.input_line)} "
                            f"(++ sets or adds each key)")


def given_twice(overrides: Sequence[Any]) -> list[str]:
    """A warning for each value the command line gives more than once, naming the one that wins."""
    by_key: dict[tuple[str, Any], list[Any]] = {}
    for o in overrides:
        if not o.is_delete():
            by_key.setdefault((o.key_or_group, o.package), []).append(o)

    def values(given: list[Any]) -> str:
        return ", then ".join(_value_text(o) for o in given)

    out = []
    paired = set()
    for knob in KNOBS:  # a short key and its verl key: the verl key wins
        short, verl = by_key.get((knob.key, None)), by_key.get((knob.verl_key, None))
        if short and verl:
            paired.add(knob.key)
            out.append(f"{knob.key} ({values(short)}) and its verl key {knob.verl_key} ({values(verl)}) are both "
                       f"given: the verl key's {_value_text(verl[-1])} wins, whatever the order (a verl key given on "
                       f"its own no longer reads the short key)")
    for (key, _), given in by_key.items():
        if len(given) > 1 and key not in paired:
            out.append(f"{key} is given {len(given)} times on the command line ({values(given)}): the last, "
                       f"{_value_text(given[-1])}, wins")
    return out


def quote(value: Any) -> str:
    """The one place values become override text: a value as Hydra's grammar reads it back as the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(quote(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{quote(str(k))}:{quote(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _reads_as(text) == ("element", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _reads_as(text: str) -> tuple[str, Any]:
    """('element', value) for one plain value, ('other', value) for a list/dict/null, ('sweep'|'error', None)."""
    try:
        (o,) = parse_overrides([f"k={text}"])
    except Exception:
        return "error", None
    if o.is_sweep_override():
        return "sweep", None
    v = o.value()
    return ("element", v) if isinstance(v, (str, int, float, bool)) else ("other", v)


# ---------------------------------------------------------------------------------------------------------------
# what exists: groups, options, keys


def our_groups(root: str | os.PathLike | None = CONF_DIR) -> dict[str, set[str]]:
    """{group: its options} for the folders of a config folder (ours by default) that hold YAML files."""
    try:
        folders = [e for e in os.scandir(root) if e.is_dir()] if root else []
    except OSError:
        folders = []
    groups = {e.name: {f[:-5] for f in os.listdir(e.path) if f.endswith(".yaml")} for e in folders}
    return {group: options for group, options in groups.items() if options}


@functools.cache
def verl_groups() -> dict[str, set[str]]:
    return our_groups(verl_config_dir())


@functools.cache
def our_tree(conf_dir: str = str(CONF_DIR)) -> dict:
    """Every key that conf/config.yaml and any group option file sets (all `@package _global_`), merged."""
    tree: dict = {}
    root = Path(conf_dir)
    for path in [root / "config.yaml", *sorted(root.glob("*/*.yaml"))]:
        try:
            data = facts.load_yaml(path)
        except Exception:
            continue
        if isinstance(data, dict):
            merge(tree, {k: v for k, v in data.items() if k not in ("defaults", "hydra")}, keep_dicts=True)
    # every typed key (grpo_lab/labconf.py)
    merge(tree, {"lab": asdict(LabConf()), "preflight": asdict(Preflight())}, keep_dicts=True)
    return tree


def verl_tree() -> dict:
    """verl's composed ppo_trainer as plain data (not resolved; read-only): grpo_lab.verl_schema's schema()."""
    return schema().tree


@functools.cache
def known_tree(conf_dir: str = str(CONF_DIR)) -> dict:
    tree: dict = {}
    merge(tree, verl_tree(), keep_dicts=True)
    merge(tree, our_tree(conf_dir), keep_dicts=True)
    return tree


# ---------------------------------------------------------------------------------------------------------------
# checks


def _closest(name: str, names: Iterable[str], cutoff: float = 0.6) -> str | None:
    match = difflib.get_close_matches(name, sorted(set(names)), n=1, cutoff=cutoff)
    return match[0] if match else None


def _did_you_mean(name: str, names: Iterable[str], prefix: str = "") -> str:
    best = _closest(name, names)
    return f"; did you mean '{prefix}{best}'?" if best else ""


def _sweep_values(o: Any) -> list[Any] | None:
    """The values of a group override: one, or a choice sweep's list; None for globs and ranges."""
    from hydra.core.override_parser.types import ChoiceSweep

    if not o.is_sweep_override():
        return [o.value()]
    v = o.value()
    return list(v.list) if isinstance(v, ChoiceSweep) else None


def picks_verl_group(o: Any, conf_dir: str | os.PathLike = CONF_DIR) -> bool:
    group = o.key_or_group.split("/")[0]
    return group in verl_groups() and (o.package is not None or group not in our_groups(conf_dir))


def _group_of(o: Any, conf_dir: str | os.PathLike) -> str | None:
    """Whose config group an override picks: 'ours', 'verl', 'hydra', or None (it sets a config key)."""
    key = o.key_or_group
    first = key.split("/")[0]
    if "/" not in key and "." in key:
        return None
    if first == "hydra":
        return "hydra" if "/" in key else None
    if picks_verl_group(o, conf_dir):
        return "verl"
    return "ours" if first in our_groups(conf_dir) else None


def _check_our_group(o: Any, conf_dir: str | os.PathLike) -> None:
    from hydra.core.override_parser.types import Glob

    group = o.key_or_group
    options = our_groups(conf_dir)[group]
    listed = ", ".join(sorted(options))
    if o.is_delete():
        return
    if o.is_sweep_override() and isinstance(o.value(), Glob):
        picked = o.value().filter(sorted(verl_groups().get(group, set())))  # Hydra's own glob match
        if picked:
            raise OverrideError(f"{o.input_line}: the glob also matches verl's own {group} file(s) "
                                f"{', '.join(picked)}, which are not grpo-lab {group} options; list ours instead: "
                                f"{group}={','.join(sorted(options))}")
        return
    for v in _sweep_values(o) or []:
        if v is None:
            why = (f"no experiment is already the default: leave '{o.input_line}' out (options: {listed})"
                   if group == "experiment" else f"every run needs a {group}: pick one of {listed} (conf/{group}/)")
            raise OverrideError(f"{o.input_line}: Hydra takes no null for a config group, and {why}")
        if str(v) not in options:
            theirs = str(v) in verl_groups().get(group, set())
            why = (f"'{v}' is verl's own {group} file, not a grpo-lab {group} option" if theirs
                   else f"'{v}' is not a {group} option")
            raise OverrideError(f"{group}={v}: {why}{_did_you_mean(str(v), options, f'{group}=')}. "
                                f"The {group} options (conf/{group}/): {listed}")


def _check_key(o: Any, conf_dir: str | os.PathLike, tree_ok: bool) -> None:
    key = o.key_or_group
    parts = key.split(".")
    adding = o.is_add() or o.is_force_add()
    top = set(known_tree(str(conf_dir))) | set(SHORT_KEYS) | set(our_groups(conf_dir)) | set(verl_groups())
    if parts[0] == "hydra":
        return  # Hydra checks its own node
    if parts[0] not in top:
        if adding and not _closest(parts[0], top, NEAR_MISS):
            return  # a new top-level key on purpose
        knob = next((k for k in KNOBS if k.env == parts[0]), None)
        if knob is not None:  # ROLLOUT_N=3 after `python run.py`: an environment variable written as an argument
            raise OverrideError(f"'{parts[0]}' is an environment variable, not a config key: write "
                                f"{knob.key}={_value_text(o)} (or {parts[0]}={_value_text(o)} before python run.py)")
        raise OverrideError(f"'{parts[0]}' is not a config key, a short key or a config group"
                            f"{_did_you_mean(parts[0], top)} (the override: {o.input_line})")
    if len(parts) == 1 or not tree_ok:
        return
    node: Any = known_tree(str(conf_dir))
    for i, part in enumerate(parts):
        if not isinstance(node, dict):
            return  # below a value or a null: nothing to compare with
        if part in node:
            node = node[part]
            continue
        if i == 0:
            return  # a short key or group name used with a dot: Hydra says what it makes of it
        parent = ".".join(parts[:i])
        target = node.get("_target_")
        names = set(node) - {"_target_"}
        # the field names of verl's dataclass `target` and its bases' (None: verl has no such dataclass)
        fields = schema().fields(target) if isinstance(target, str) else None
        if fields is not None:
            names |= fields - {"_target_"}
            if part in names:  # a dataclass field verl's YAML leaves out
                if adding:
                    return
                raise OverrideError(f"'{parent}.{part}' is a field of verl's {target.rpartition('.')[2]} that verl's "
                                    f"config does not list: add it with a plus, +{key}={_value_text(o)}")
        near = _closest(part, names, NEAR_MISS)
        hint = _did_you_mean(part, names, f"{parent}.")
        if not adding:
            extra = ("" if target or hint else
                     f" To add a key to '{parent}' (its keys are free-form), write +{key}={_value_text(o)}.")
            raise OverrideError(f"'{key}' is not a config key: '{parent}' has no '{part}'{hint}{extra}")
        if isinstance(target, str):
            raise OverrideError(f"'{key}': '{parent}' is verl's {target.rpartition('.')[2]}, whose keys are fixed, "
                                f"and it has no '{part}'{hint} (verl would fail on it inside a worker)")
        if near:
            raise OverrideError(f"'{key}' adds a new key next to '{parent}.{near}'{hint} (if the new key is meant, "
                                f"it is a near miss that verl would ignore)")
        return


def _check_run_name(o: Any, env: str | None) -> None:
    """experiment_name names the run's folders: each value typed (or swept) must be a safe folder name; a value
    that interpolates is the preflight's (rule experiment_name_folder)."""
    if o.key_or_group not in ("experiment_name", "trainer.experiment_name") or o.is_delete():
        return
    name = env or o.key_or_group
    for v in _sweep_values(o) or []:
        if isinstance(v, str) and "${" not in v:
            why = unsafe_name(name, v, name)
            if why:
                raise OverrideError(why)


def _value_text(o: Any) -> str:
    return o.input_line.partition("=")[2] or "..."


def check(cli: CommandLine, conf_dir: str | os.PathLike = CONF_DIR) -> None:
    """Raise OverrideError for the first override that is not what the user can mean (see the module doc)."""
    f = cli.flags
    modes = [name for name, attr in (("-m/--multirun", "multirun"), ("--run", "run"), ("--cfg", "cfg"),
                                     ("--info", "info"), ("--shell-completion", "shell_completion"))
             if getattr(f, attr, None)]
    if len(modes) > 1:  # Hydra would raise "Only one of --run, --multirun, --cfg, ..." with a traceback
        raise OverrideError(f"{' and '.join(modes)} cannot go together: Hydra runs one mode at a time. To see what a "
                            f"sweep's first job composes, drop -m: python run.py --cfg job <overrides without sweeps>")
    if not getattr(f, "multirun", False):  # Hydra: "Ambiguous value for argument"
        for o in cli.overrides:
            if o.is_sweep_override() and not o.key_or_group.startswith("hydra."):
                raise OverrideError(f"{o.input_line} is a list of values, which only a sweep takes (Hydra's -m): "
                                    f"{_with_m(cli.args)}"
                                    f"{'' if _group_of(o, conf_dir) else _not_a_sweep(o, o.key_or_group, env=False)}")
    overrides = cli.overrides + parse_overrides(cli.env)
    tree_ok = not any(_group_of(o, conf_dir) == "verl" for o in overrides)
    added: set[str] = set()  # keys an earlier `+key=` of the same command line brought in (a later `key=` may set it)
    for o in overrides:
        _check_run_name(o, cli.env_names.get(o.input_line))
        kind = _group_of(o, conf_dir)
        if kind == "ours" and o.package is None and "/" not in o.key_or_group:
            _check_our_group(o, conf_dir)
        elif kind is None and not any(o.key_or_group == k or o.key_or_group.startswith(k + ".") for k in added):
            _check_key(o, conf_dir, tree_ok)
            _check_dict_value(o)
        if o.is_add() and o.key_or_group in added:  # Hydra: "Could not append to config"
            raise OverrideError(f"{o.input_line}: an earlier +{o.key_or_group} of this command line added it, and "
                                f"Hydra's + only adds: write ++{o.input_line.lstrip('+')} to set it again")
        if o.is_add() or o.is_force_add():
            added.add(o.key_or_group)


def tree_needed(args: Sequence[str] | CommandLine, conf_dir: str | os.PathLike = CONF_DIR) -> str | None:
    """The first command-line argument (of args, or the CommandLine run.py parsed) that needs verl's own defaults
    tree; None when the composed cache serves. conf_dir's groups share names with verl's: `model=...` is ours."""
    if verl_config_dir() is None:
        return None
    cli = args if isinstance(args, CommandLine) else parse(list(args))
    flags = vars(cli.flags)
    if flags.get("info") is not None:
        return _typed(cli.args, ("--info", "-i"))
    if flags.get("cfg") in ("hydra", "all"):
        return _typed(cli.args, ("--cfg", "-c"), flags["cfg"])
    if flags.get("config_dir"):
        return _typed(cli.args, ("--config-dir", "-cd"))
    for o in cli.overrides + parse_overrides(cli.env):
        if o.key_or_group == "hydra.searchpath" or picks_verl_group(o, conf_dir):
            return o.input_line
    return None


def _typed(args: Sequence[str], names: tuple[str, ...], value: str | None = None) -> str:
    """The flag as it was typed (`-c all`, `--cfg=hydra`, `--info`)."""
    for i, a in enumerate(args):
        flag = a.partition("=")[0]
        if flag in names:
            if value is not None and "=" not in a and i + 1 < len(args):
                return f"{a} {args[i + 1]}"
            return a
    return names[0]


@contextlib.contextmanager
def tree_if_needed(args: Sequence[str] | CommandLine,
                   conf_dir: str | os.PathLike = CONF_DIR) -> Iterator[str | None]:
    """Within: the schema cache off for Hydra (GRPO_LAB_VERL_CACHE=0) if tree_needed(args) says so; yields that
    argument."""
    arg = tree_needed(args, conf_dir) if verl_cache.enabled() else None
    with verl_cache.off() if arg else contextlib.nullcontext():
        yield arg


def prepare(argv: Sequence[str], environ: Mapping[str, str] | None = None, err=sys.stderr) -> CommandLine:
    """run.py's front door: argv (with the program name) parsed and checked, the environment's knobs added.
    A mistake: its message on `err` and SystemExit(2)."""
    environ = os.environ if environ is None else environ
    for wrong, right in misspelt_env(environ).items():
        print(f"grpo-lab: warning: environment variable {wrong} is not a grpo-lab knob and is ignored; "
              f"did you mean {right}?", file=err)
    try:
        cli = parse(argv[1:], environ)
        check(cli)
    except OverrideError as e:
        print(f"grpo-lab: error: {e}", file=err)
        raise SystemExit(2) from None
    for w in cli.warnings:  # also in each job's plan.json (grpo_lab/launch/job.py)
        print(f"grpo-lab: warning: {w}", file=err)
    return cli
