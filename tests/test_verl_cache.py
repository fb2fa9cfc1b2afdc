"""The cache of verl's schema: built once by a child process, read back, rebuilt when verl changes, never required,
and a broken or partial file never an error. (Each build imports verl in a child process: seconds; the tests that
need a build of their own are few.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONF, ROOT

from grpo_lab.cli import overrides
from grpo_lab.facts import load_yaml
from grpo_lab.verl_schema import build, schema, verl_cache
from grpo_lab.verl_schema.api import VerlSchema, cache_clear
from grpo_lab.verl_schema.hydra_internals import own_version_base, version_base, version_base_as
from grpo_lab.verl_schema.verl_paths import verl_config_dir

VERL = verl_config_dir()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of its own, and no schema left in this process."""
    monkeypatch.setenv(verl_cache.DIR_ENV, str(tmp_path / "cache"))
    cache_clear()
    yield tmp_path / "cache"
    cache_clear()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One build of the installed verl's schema into a folder of its own: (that folder, the document)."""
    folder = tmp_path_factory.mktemp("built")
    old = os.environ.get(verl_cache.DIR_ENV)
    os.environ[verl_cache.DIR_ENV] = str(folder)
    try:
        loaded = verl_cache.load(VERL)
    finally:
        if old is None:
            os.environ.pop(verl_cache.DIR_ENV)
        else:
            os.environ[verl_cache.DIR_ENV] = old
    assert loaded.origin == "built", loaded.doc["problems"]
    return folder, loaded.doc


def _files(cache: Path) -> list[Path]:
    return sorted(cache.glob("verl-schema-*.json")) if cache.is_dir() else []


def _verl_copy(tmp_path: Path, version: str = "0.9.1") -> str:
    """verl's config folder copied as verl/trainer/config, with verl/version/version beside it (what the key reads)."""
    dst = tmp_path / "verl" / "trainer" / "config"
    shutil.copytree(VERL, dst, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    (tmp_path / "verl" / "version").mkdir()
    (tmp_path / "verl" / "version" / "version").write_text(version + "\n")
    return str(dst)


def test_written_once_then_read_back(built, cache):
    folder, doc = built
    (path,) = _files(folder)
    assert json.loads(path.read_text())["key"] == verl_cache.cache_key(VERL)
    assert doc["tree"]["actor_rollout_ref"]["actor"]["strategy"] == "fsdp"  # verl's dp_actor, through its defaults
    assert "defaults" not in doc["tree"] and doc["serves_hydra"] and doc["sources"]
    # a new process: the file serves, nothing is built
    cache.mkdir(parents=True)
    shutil.copy(path, cache / path.name)
    again = verl_cache.load(VERL)
    assert again.origin == "file" and again.doc == json.loads(path.read_text())
    s = schema()
    assert s.origin == "file" and s.tree == doc["tree"]
    first, second = s.composed(), s.composed()
    assert first is not second and first == second  # each compose its own copy (Hydra moves its nodes)


def test_rebuilt_when_verls_version_or_a_config_file_changes(cache, tmp_path):
    verl = _verl_copy(tmp_path)
    first = verl_cache.load(verl)
    assert first.origin == "built" and "grpo_lab_marker" not in first.doc["tree"]["data"]
    assert verl_cache.load(verl).origin == "file"
    # a config file changes
    leaf = Path(verl) / "data" / "legacy_data.yaml"
    leaf.write_text(leaf.read_text() + "\ngrpo_lab_marker: 7\n")
    st = leaf.stat()
    os.utime(leaf, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    second = verl_cache.load(verl)
    assert second.origin == "built" and second.doc["tree"]["data"]["grpo_lab_marker"] == 7
    # verl's version changes, nothing else: a file of its own
    (tmp_path / "verl" / "version" / "version").write_text("0.9.2\n")
    third = verl_cache.load(verl)
    assert third.origin == "built" and third.doc["verl"] == "0.9.2" and second.doc["verl"] == "0.9.1"
    assert len(_files(cache)) == 3
    cache_clear()
    assert schema(verl).version == "0.9.2" and schema(verl).origin == "file"


def test_the_key_follows_verls_version_and_its_config_files(tmp_path):
    verl = _verl_copy(tmp_path)
    key = verl_cache.cache_key(verl)
    assert verl_cache.cache_key(verl) == key
    (tmp_path / "verl" / "version" / "version").write_text("0.10.0\n")
    bumped = verl_cache.cache_key(verl)
    assert bumped != key and verl_cache.verl_version(verl) == "0.10.0"
    leaf = Path(verl) / "legacy_reward_impl.yaml"
    leaf.write_text(leaf.read_text() + "# one more line\n")
    assert verl_cache.cache_key(verl) not in (key, bumped)


@pytest.mark.parametrize("text", ["", "{\"format\": 2, \"key\": ", "[1, 2]", "\x00\x01 not json", "null"])
def test_a_broken_or_cut_off_file_is_no_document(built, tmp_path, text):
    path = tmp_path / "schema.json"
    path.write_text(text)
    assert verl_cache.read(path, verl_cache.cache_key(VERL)) is None


@pytest.mark.parametrize("spoil", ["no tree", "tree a list", "other key", "old format", "no sources", "bad sources"])
def test_a_partial_or_foreign_document_is_no_document(built, tmp_path, spoil):
    _, doc = built
    key = verl_cache.cache_key(VERL)
    doc = json.loads(json.dumps(doc))
    assert verl_cache.valid(doc, key)
    if spoil == "no tree":
        del doc["tree"]
    elif spoil == "tree a list":
        doc["tree"] = []
    elif spoil == "other key":
        doc["key"] = "0" * 64
    elif spoil == "old format":
        doc["format"] = verl_cache.FORMAT - 1
    elif spoil == "no sources":
        del doc["sources"]
    else:
        doc["sources"] = {"x": 1}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(doc))
    assert verl_cache.read(path, key) is None


def test_a_changed_verl_source_file_makes_the_document_stale(built, tmp_path):
    _, doc = built
    key = verl_cache.cache_key(VERL)
    edited = tmp_path / "model.py"  # stands for one of verl's files in an editable install
    edited.write_text("x = 1\n")
    st = edited.stat()
    doc = {**doc, "sources": {**doc["sources"], str(edited): [st.st_mtime_ns, st.st_size]}}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(doc))
    assert verl_cache.read(path, key) == doc
    edited.write_text("x = 22\n")
    assert verl_cache.read(path, key) is None
    assert verl_cache.stale_sources(doc["sources"]) == [str(edited)]


def test_a_broken_cache_file_is_rebuilt_not_an_error(built, cache):
    folder, doc = built
    cache.mkdir(parents=True)
    (good,) = _files(folder)
    broken = cache / good.name
    broken.write_text(good.read_text()[: len(good.read_text()) // 2])  # a write cut off half-way
    loaded = verl_cache.load(VERL)
    assert loaded.origin == "built" and loaded.doc["tree"] == doc["tree"]
    assert json.loads(broken.read_text())["key"] == verl_cache.cache_key(VERL)
    cache_clear()
    assert schema().origin == "file" and schema().fields("verl.workers.config.HFModelConfig")


def test_unwritable_cache_dir_still_serves_the_same_schema(built, tmp_path, monkeypatch):
    _, doc = built
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    monkeypatch.setenv(verl_cache.DIR_ENV, str(blocker / "cache"))  # mkdir fails, for root too
    cache_clear()
    s = schema()
    assert s.origin == "built" and s.tree == doc["tree"] and s.model_keys
    assert s.composed() is not None
    assert list(tmp_path.glob("**/*.tmp")) == []
    cache_clear()


def test_a_verl_file_that_sets_hydras_node_is_not_served_to_hydra(cache, tmp_path):
    verl = _verl_copy(tmp_path)
    leaf = Path(verl) / "legacy_reward_impl.yaml"
    leaf.write_text(leaf.read_text() + "\nhydra:\n  job:\n    chdir: true\n")
    s = schema(verl)
    assert s.composed() is None  # the plugin then hands Hydra verl's own files
    assert "serves_hydra" in s.problems and s.tree["actor_rollout_ref"]["actor"]["strategy"] == "fsdp"


def test_one_file_whatever_version_base_the_process_has_now(built, cache):
    # Hydra's override parser sets its compatibility base (1.1) when asked before an app sets one: rawcmd checks its
    # command line so, run.py after hydra.main(version_base=None). Both read the one file; only a Hydra app of the
    # tree's own version_base gets the cached tree, any other composes verl's files
    folder, _ = built
    cache.mkdir(parents=True)
    for f in _files(folder):
        shutil.copy(f, cache / f.name)
    before = version_base()
    with version_base_as("1.1"):
        assert version_base() == "1.1"
        s = schema()
        assert s.origin == "file" and s.tree and s.composed() is None
    assert version_base() == before
    with version_base_as(own_version_base()):
        assert s.composed() is not None and s.version_base == own_version_base()
    assert len(_files(cache)) == 1


def test_off_switch(monkeypatch):
    for value, on in [("0", False), ("off", False), ("false", False), ("1", True), ("", True)]:
        monkeypatch.setenv(verl_cache.ENV, value)
        assert verl_cache.enabled() is on, value
    monkeypatch.delenv(verl_cache.ENV)
    assert verl_cache.enabled()
    with verl_cache.off():
        assert not verl_cache.enabled()
    assert verl_cache.ENV not in os.environ


def test_only_the_child_imports_verl(tmp_path):
    code = (
        "import sys\n"
        "from hydra import compose, initialize_config_dir\n"
        f"with initialize_config_dir(config_dir={str(CONF)!r}, version_base=None):\n"
        "    cfg = compose('config', overrides=['experiment=smoke_tiny'])\n"
        "assert cfg.actor_rollout_ref.actor.strategy == 'fsdp'\n"
        "from grpo_lab.verl_schema import schema\n"
        "assert schema().origin == 'built' and schema().model_keys\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'verl', 'torch', 'ray', 'pandas', 'numpy'}))\n")
    env = {**os.environ, verl_cache.DIR_ENV: str(tmp_path / "cache")}
    env.pop(verl_cache.ENV, None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
    assert len(_files(tmp_path / "cache")) == 1


def test_without_the_child_the_tree_still_serves_and_the_rest_is_unknown(built):
    _, doc = built
    fallback = build.build(VERL, own_version_base(), objects=False)
    assert fallback["tree"] == doc["tree"] and fallback["defaults"] == doc["defaults"]
    fallback.update(format=verl_cache.FORMAT, key=verl_cache.cache_key(VERL), verl="0.9.1",
                    version_base=own_version_base())
    s = VerlSchema(fallback, config_dir=VERL, origin="fallback")
    assert s.composed() is not None and s.fields("verl.workers.config.HFModelConfig") is None
    assert s.model_keys == frozenset() and "could not be read" in s.model_keys_from
    assert s.data_sources is None and s.knows_data_source("openai/gsm8k") is None
    assert not s.rollout_engines and "could not be read" in s.rollout_from


@pytest.mark.parametrize("args,needed", [
    (["ppo_mini_batch_size=7", "experiment=smoke_tiny"], None),
    (["model=qwen3_4b", "rollout=tp2_mem06", "~model"], None),  # our groups of the same names as verl's
    (["-m", "rollout_gpu_mem_util=0.3,0.4", "actor_rollout_ref.actor.optim.lr=1e-6", "data.train_batch_size=8"],
     None),
    (["--cfg", "job", "--resolve", "hydra/job_logging=disabled", "+trainer.x=1"], None),
    (["-cn", "config", "hydra.run.dir=outputs/x"], None),
    (["model_engine=megatron"], "model_engine=megatron"),
    (["-m", "model_engine=dp,veomni"], "model_engine=dp,veomni"),
    (["actor@actor_rollout_ref.actor=veomni_actor"], "actor@actor_rollout_ref.actor=veomni_actor"),
    (["model@actor_rollout_ref.model=hf_model"], "model@actor_rollout_ref.model=hf_model"),
    (["optim@actor_rollout_ref.actor.optim=veomni"], "optim@actor_rollout_ref.actor.optim=veomni"),
    (["+model_engine=veomni"], "+model_engine=veomni"),
    (["~model_engine"], "~model_engine"),
    (["--info", "defaults"], "--info"),
    (["--cfg", "hydra"], "--cfg hydra"),
    (["-c", "all"], "-c all"),
    (["--config-dir", "/somewhere"], "--config-dir"),
    (["hydra.searchpath=[file:///x]"], "hydra.searchpath=[file:///x]"),
])
def test_tree_needed(args, needed):
    assert overrides.tree_needed(args, CONF) == needed


def test_tree_if_needed_turns_the_cache_off_inside_only(monkeypatch):
    monkeypatch.delenv(verl_cache.ENV, raising=False)
    with overrides.tree_if_needed(["model_engine=veomni"], CONF) as arg:
        assert arg == "model_engine=veomni" and not verl_cache.enabled()
    assert verl_cache.ENV not in os.environ
    with overrides.tree_if_needed(["ppo_mini_batch_size=8"], CONF) as arg:
        assert arg is None and verl_cache.enabled()


def test_no_config_file_of_ours_picks_a_verl_group_option():
    # the cached ppo_trainer has no defaults list left to override: such a file would need GRPO_LAB_VERL_CACHE=0
    theirs, ours = set(overrides.verl_groups()), set(overrides.our_groups(CONF))
    for path in sorted(CONF.rglob("*.yaml")):
        for entry in (load_yaml(path) or {}).get("defaults", []):
            key = next(iter(entry)) if isinstance(entry, dict) else entry
            group, _, package = key.removeprefix("override ").lstrip("/").partition("@")
            assert not (group in theirs and (package or group not in ours)), f"{path}: {entry}"
