"""Which model a job plans: the one verl will load. A local folder's config.json, else the Hugging Face cache's copy
of the hub id, else the conf/model/ group whose model_path is that id (MODEL_PATH=Qwen/Qwen3-0.6B plans the 0.6B,
whatever the model group), else the model group's own facts (lab.model)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from grpo_lab import facts
from grpo_lab.labconf import Lab
from grpo_lab.memory.memplan_arch import Arch
from grpo_lab.memory.verl_view import VerlView


@dataclass
class PlannedModel:
    arch: Arch | None
    info: dict[str, Any] = field(default_factory=dict)  # name, hub_id, thinking (a model group's lab.model)
    mismatch: str = ""  # model_path names no model we know, and the model group is another one
    notes: list[str] = field(default_factory=list)
    # the folder's mark: random weights, for memory and speed only (grpo_lab.tasks.qwen3_random)
    random_weights: str = ""
    # max_position_embeddings of the model's own config, when override_config raised it
    file_positions: int | None = None


def _from_config_json(path: Path) -> Arch:
    cfg = json.loads(path.read_text())
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    return Arch.from_mapping(cfg, source=str(path))


def position_override(cfg: VerlView) -> int | None:
    """actor_rollout_ref.model.override_config's max_position_embeddings (under its model_config when it has one), as
    verl 0.9.1 sets it on the model's config before the rollout checks max_model_len against it
    (verl/workers/config/model.py HFModelConfig.__post_init__ -> verl/utils/model.py update_model_config)."""
    ov = cfg.model.override_config
    ov = ov.get("model_config", ov)
    v = ov.get("max_position_embeddings") if isinstance(ov, Mapping) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def resolve_model(cfg: VerlView, lab: Lab, environ: Mapping[str, str]) -> PlannedModel:
    """The model verl will load (module docstring), with the positions override_config gives it."""
    m = _model_files(cfg, lab, environ)
    positions = position_override(cfg)
    if m.arch is not None and positions is not None:
        m.file_positions = m.arch.max_position_embeddings
        m.arch = replace(m.arch, max_position_embeddings=positions)
    return m


def _model_files(cfg: VerlView, lab: Lab, environ: Mapping[str, str]) -> PlannedModel:
    path = str(cfg.model.hf_config_path or cfg.model.path or "")
    group = asdict(lab.model)
    # the job's own model option names this model: its facts are the job's lab.model, composed from that option
    own = bool(path and group.get("name") and path == group.get("hub_id"))
    known = group if own else facts.model_group(path, group.get("name") or "")
    if known and known.get("name") == group.get("name"):  # the job's own option, by its model_path: as the job has it
        known = group
    info = dict(known) if known else group
    local = Path(os.path.expanduser(path)) if path else None
    notes: list[str] = []
    if local is not None and (local / "config.json").is_file():
        try:
            return PlannedModel(_from_config_json(local / "config.json"), info,
                                random_weights=facts.random_weights_mark(local / "config.json"))
        except (OSError, ValueError, KeyError, TypeError) as e:
            notes.append(f"could not read {local / 'config.json'} ({e}); planning the model group's facts")
    elif local is not None and local.is_dir():  # a folder with no model in it is no model: not the group's either
        return PlannedModel(None, {}, notes=[f"memory plan skipped: {path} holds no config.json, so there is no model "
                                           f"to plan (the model option's {group.get('name')} is not planned in its "
                                           f"place)"])
    cached = facts.hf_cached_config(path, environ) if path and not (local and local.exists()) else None
    if cached is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return PlannedModel(_from_config_json(cached), info, notes=notes)
    if known and all(known.get(k) is not None for k in Arch.FIELDS):
        return PlannedModel(Arch.from_mapping(known, source=f"conf/model ({known.get('name')}: {path})"),
                          info, notes=notes)
    if all(group.get(k) is not None for k in Arch.FIELDS):
        hub = group.get("hub_id")
        mismatch = path if path and hub and path != hub and not (local and local.exists()) else ""
        return PlannedModel(Arch.from_mapping(group, source=f"lab.model ({group.get('name')})"), group,
                          mismatch, notes)
    return PlannedModel(None, info, notes=notes + [
        "no architecture facts (no local config.json, no known model, no lab.model): memory plan skipped"])
