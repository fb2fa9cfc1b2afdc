"""Issue 44 item 4: settings that passed the plan and failed after Ray and vLLM had started (verl 0.9.1), refused
before start-up (or "not ready to launch here" where they depend on the machine), through run.py as a user types
them; each printed fix, appended to the same command, passes."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from pathlib import Path

import pytest
from conftest import NOT_READY_EXIT, composed, fake_gpus, model_folder, run_py

from grpo_lab import facts
from grpo_lab.checks.preflight import run_preflight
from grpo_lab.memory.run import Run

PLANNED = (0, NOT_READY_EXIT)
_JOB = itertools.count()


def plan(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[int, dict, str]:
    """python run.py ARGS preflight.only=true: (exit code, plan.json, console text)."""
    job = tmp_path / f"job{next(_JOB)}"
    out = run_py(*args, "preflight.only=true", f"hydra.run.dir={job}", env=env)
    text = out.stdout + out.stderr
    assert "Traceback" not in text, text[-3000:]
    return out.returncode, json.loads((job / "plan.json").read_text()), text


def refused_then_fixed(tmp_path: Path, args: tuple[str, ...], rule: str, *says: str) -> dict:
    """Refused (exit 2) by `rule`, its message saying each of `says`; its first printed alternative appended passes."""
    rc, p, text = plan(tmp_path, *args)
    assert rc == 2, text[-3000:]
    (e,) = [e for e in p["errors"] if e["rule"] == rule]
    assert all(s in e["message"] for s in says), e["message"]
    assert e["checked"].startswith("re-checked: the preflight passes"), e
    rc, p, text = plan(tmp_path, *args, *shlex.split(e["fix"].split("  or  ")[0]))
    assert rc in PLANNED and not p["errors"], text[-3000:]
    return e


def test_a_negative_lora_rank_is_refused(tmp_path):
    e = refused_then_fixed(tmp_path, ("actor_rollout_ref.model.lora_rank=-1",), "lora_rank_negative",
                           "actor_rollout_ref.model.lora_rank=-1", "lora_rank > 0")
    assert e["fix"].startswith("actor_rollout_ref.model.lora_rank=0  or  actor_rollout_ref.model.lora_rank=64")


LORA = ("actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.actor.strategy=fsdp2")


@pytest.mark.parametrize("targets,fix", [
    ("[foo,bar]", "actor_rollout_ref.model.target_modules=all-linear"),
    ("all_linear", "actor_rollout_ref.model.target_modules=all-linear"),  # peft's spelling has a hyphen
    ("[q_prj,v_poj]", '"actor_rollout_ref.model.target_modules=[q_proj,v_proj]"  or  '
                      "actor_rollout_ref.model.target_modules=all-linear")])
def test_lora_target_modules_the_model_does_not_have_are_refused(tmp_path, targets, fix):
    e = refused_then_fixed(tmp_path, (*LORA, f"actor_rollout_ref.model.target_modules={targets}"),
                           "lora_target_modules", "not found in the base model")
    assert e["fix"] == fix


@pytest.mark.parametrize("args", [(*LORA, "actor_rollout_ref.model.target_modules=[q_proj,foo]"),  # peft: one matches
                                  (*LORA, "actor_rollout_ref.model.target_modules=.*_proj"),  # a regular expression
                                  ("actor_rollout_ref.model.target_modules=[foo,bar]",)])  # LoRA off: never read
def test_lora_target_modules_peft_takes_pass(args):
    r = run_preflight(Run.build(*composed(*args), {}), launching=False)
    assert "lora_target_modules" not in {p.rule for p in r.errors}


def test_a_logger_verl_does_not_know_is_refused_with_the_closest(tmp_path):
    e = refused_then_fixed(tmp_path, ("trainer.logger=[console,tensorbord]",), "logger_unknown",
                           "knows no logger tensorbord", "'tensorbord is not supported'")
    assert e["fix"] == '"trainer.logger=[console,tensorboard]"'


def test_leaving_out_the_file_logger_is_warned(tmp_path):
    rc, p, text = plan(tmp_path, "trainer.logger=[console]")
    (w,) = [w for w in p["warnings"] if w["rule"] == "logger_unknown"]
    assert rc in PLANNED and "no metrics.jsonl" in w["message"] and "make report" in w["message"], text[-3000:]
    rc, p, text = plan(tmp_path, "trainer.logger=[console]", *shlex.split(w["fix"]))
    assert rc in PLANNED and "logger_unknown" not in {w["rule"] for w in p["warnings"]}, text[-3000:]


def test_a_logger_whose_package_is_missing_is_not_ready_here_and_refused_at_launch(tmp_path):
    args = ("trainer.logger=[console,file,mlflow]",)  # mlflow: not installed on the test machine
    assert not facts.module_available("mlflow")
    rc, p, text = plan(tmp_path, *args)
    (n,) = [n for n in p["not_ready_here"] if n["rule"] == "logger_package_missing"]
    assert rc == NOT_READY_EXIT and "[logger_package_missing]" in text
    assert "mlflow needs the mlflow package, not installed here" in n["message"]
    assert n["command"] == '"trainer.logger=[console,file]"' and n["checked"].startswith("re-checked: the preflight")
    rc, p, text = plan(tmp_path, *args, *shlex.split(n["command"]))
    assert rc in PLANNED and "logger_package_missing" not in {n["rule"] for n in p["not_ready_here"]}, text[-3000:]
    r = run_preflight(Run.build(*composed(*args), {}), launching=True)  # launching: a refusal
    assert "logger_package_missing" in {e.rule for e in r.errors}


def test_a_rollout_engine_not_installed_is_not_ready_here_and_refused_at_launch(tmp_path):
    """sglang (and vllm) are not installed on the CPU test machine: a plan says what is missing, a launch refuses."""
    assert not facts.module_available("sglang")
    rc, p, text = plan(tmp_path, "rollout=sglang_tp1_mem04")
    (n,) = [n for n in p["not_ready_here"] if n["rule"] == "rollout_engine_missing"]
    verdict = next(line for line in text.splitlines() if line.startswith("preflight: "))
    assert rc == NOT_READY_EXIT and "[rollout_engine_missing]" in verdict, text[-3000:]
    assert "rollout.name=sglang, and the sglang package is not installed here" in n["message"]
    assert n["command"].endswith("install sglang as docs/sglang.md says")
    r = run_preflight(Run.build(*composed("rollout=sglang_tp1_mem04"), {}), launching=True)
    assert "rollout_engine_missing" in {e.rule for e in r.errors}
    # where vllm is importable (a GPU machine, faked), switching to it is the fix, and it passes appended
    rc, p, text = plan(tmp_path, "rollout=sglang_tp1_mem04", env=fake_gpus(tmp_path, 4))
    (n,) = [n for n in p["not_ready_here"] if n["rule"] == "rollout_engine_missing"]
    fix = "actor_rollout_ref.rollout.name=vllm"
    assert n["command"].startswith(f"{fix}  or  install sglang") and n["checked"].startswith("re-checked"), n
    rc, p, text = plan(tmp_path, "rollout=sglang_tp1_mem04", fix, env=fake_gpus(tmp_path, 4))
    assert "rollout_engine_missing" not in {n["rule"] for n in p.get("not_ready_here", ())}, text[-3000:]


def test_a_max_prompt_length_below_the_datas_prompts(tmp_path, made):
    """make tiny's 512 training prompts, measured with its tokenizer and chat template: below every one refused, below
    some warned with the share, as many as verl's own RLHFDataset drops; no local tokenizer: not measured."""
    out = made[0]
    args = ("experiment=smoke_tiny", f"model_path={out / 'tiny-qwen3'}",
            f"train_file={out / 'arith_tiny' / 'train.parquet'}", f"test_file={out / 'arith_tiny' / 'test.parquet'}")
    e = refused_then_fixed(tmp_path, (*args, "max_prompt_length=16"), "prompts_too_long",
                           "512 of the first 512 training prompts (at most 5000 read)", "'Train dataloader is empty!'")
    longest = int(re.fullmatch(r"max_prompt_length=(\d+)", e["fix"]).group(1))
    rc, p, text = plan(tmp_path, *args, f"max_prompt_length={longest - 3}")
    (w,) = [w for w in p["warnings"] if w["rule"] == "prompts_too_long"]
    assert rc in PLANNED and w["fix"] == e["fix"], text[-3000:]
    over = int(re.search(r"max_prompt_length=\d+: (\d+) of the first 512", w["message"]).group(1))
    assert 0 < over < 512 and f"({over / 512:.0%} of them)" in w["message"]
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    cfg = OmegaConf.create({"max_prompt_length": longest - 3, "filter_overlong_prompts": True,
                            "cache_dir": str(tmp_path / "cache"), "filter_overlong_prompts_workers": 1,
                            "apply_chat_template_kwargs": {"enable_thinking": False}})
    tok = AutoTokenizer.from_pretrained(out / "tiny-qwen3")
    assert len(RLHFDataset(str(out / "arith_tiny" / "train.parquet"), tok, cfg)) == 512 - over  # verl's own count
    no_tokenizer = (*args[:1], f"model_path={model_folder(tmp_path / 'model')}", *args[2:], "max_prompt_length=16")
    r = run_preflight(Run.build(*composed(*no_tokenizer), {}), launching=False)
    assert "prompts_too_long" not in {p.rule for p in r.errors + r.warnings}


def test_prompt_lengths_are_found_again_by_the_files_contents(tmp_path, made):
    """The lengths measured are kept by the files' contents too: make tiny's tokenizer and data copied to another
    folder are not measured again (here transformers cannot be imported: a stand-in that raises), and the same refusal
    follows; a changed train file is measured anew (here: it cannot be, so its prompts are not judged)."""
    import shutil

    import pyarrow.parquet as pq

    out = made[0]
    tok = shutil.copytree(out / "tiny-qwen3", tmp_path / "tok")
    data = shutil.copytree(out / "arith_tiny", tmp_path / "d")
    (tmp_path / "no-transformers" / "transformers").mkdir(parents=True)
    (tmp_path / "no-transformers" / "transformers" / "__init__.py").write_text("raise ImportError('not here')\n")
    broken = {"PYTHONPATH": str(tmp_path / "no-transformers")}

    def refusal(model: Path, folder: Path, env: dict | None = None) -> dict | None:
        _, p, _ = plan(tmp_path, "experiment=smoke_tiny", f"model_path={model}", f"train_file={folder}/train.parquet",
                       f"test_file={folder}/test.parquet", "max_prompt_length=16", env=env)
        return next((e for e in p["errors"] if e["rule"] == "prompts_too_long"), None)

    measured = refusal(out / "tiny-qwen3", out / "arith_tiny")
    copied = refusal(tok, data, env=broken)
    assert measured and copied and copied["message"] == measured["message"].replace(str(out / "tiny-qwen3"), str(tok))
    pq.write_table(pq.read_table(data / "train.parquet").slice(0, 100), data / "train.parquet")
    assert refusal(tok, data, env=broken) is None
