"""make tiny (grpo_lab.tasks.tiny) and the warm-up (grpo_lab.tasks.warmup) on CPU, offline."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from grpo_lab.facts import load_yaml
from grpo_lab.tasks import tiny

ROOT = Path(__file__).resolve().parent.parent
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for k, v in OFFLINE.items():
        monkeypatch.setenv(k, v)


def test_make_tiny_is_fast_and_writes_the_layout(made):
    out, seconds, stdout = made
    assert seconds < 30, f"make tiny took {seconds:.1f}s"
    assert {p.name for p in out.iterdir()} == {"arith_tiny", "tiny-qwen3"}  # no temporary folders left
    assert {p.name for p in (out / "arith_tiny").iterdir()} >= {"train.parquet", "test.parquet"}
    files = {p.name for p in (out / "tiny-qwen3").iterdir()}
    assert files >= {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json"}
    assert "train 512 rows, test 64 rows" in stdout
    assert "next: python run.py experiment=smoke_tiny" in stdout  # the newcomer's next step


def test_architecture_matches_conf_model_tiny_qwen3(made):
    out, _, _ = made
    conf = load_yaml(ROOT / "conf" / "model" / "tiny_qwen3.yaml")["lab"]["model"]
    config = json.loads((out / "tiny-qwen3" / "config.json").read_text())
    keys = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "tie_word_embeddings", "max_position_embeddings"]
    assert {k: config[k] for k in keys} == {k: conf[k] for k in keys}
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["dtype"] == "bfloat16"


def test_model_and_tokenizer_load_and_agree(made):
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path = made[0] / "tiny-qwen3"
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert 300_000 < sum(p.numel() for p in model.parameters()) < 400_000

    text = 'What is 23 + 48? Let\'s think step by step and output the final answer after "####".\n#### 71 héllo 日本'
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    # transformers' Qwen2Tokenizer rebuilds the pipeline from vocab + merges: the same ids as tokenizer.json's own
    assert ids == Tokenizer.from_file(str(path / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert tok("4 8")["input_ids"] == tok("4")["input_ids"] + tok(" ")["input_ids"] + tok("8")["input_ids"]  # digits
    assert len(tok.encode("\n", add_special_tokens=False)) == 1  # verl's Qwen continuous-token builder needs this

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>"]
    special_ids = tok.convert_tokens_to_ids(specials)
    assert all(isinstance(i, int) and i < model.config.vocab_size for i in special_ids)
    assert len(tok) <= model.config.vocab_size
    assert f"tokenizer {len(tok)} tokens" in made[2]
    documented = re.search(r"the tokenizer has only (\d+) tokens", (ROOT / "docs" / "tasks.md").read_text())
    assert documented and int(documented.group(1)) == len(tok)  # docs/tasks.md's count is make tiny's
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.bos_token is None
    assert model.config.eos_token_id == tok.eos_token_id
    # <think> stays in decoded text (special=False, as in Qwen3); <|im_end|> does not
    assert tok.decode(tok("<think>\nx\n</think>\n\n#### 7<|im_end|>")["input_ids"], skip_special_tokens=True) \
        == "<think>\nx\n</think>\n\n#### 7"
    gen = GenerationConfig.from_pretrained(path)
    assert tok.eos_token_id in gen.eos_token_id and gen.pad_token_id == tok.pad_token_id

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 4096)


def test_chat_template_honours_enable_thinking(made):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(made[0] / "tiny-qwen3")
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    on = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    off = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert on == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert on == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    assert off == on + "<think>\n\n</think>\n\n"
    with_system = tok.apply_chat_template([{"role": "system", "content": "Be brief."}] + msgs, tokenize=False)
    assert with_system == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
    # the last assistant turn carries its reasoning, as in Qwen3
    full = tok.apply_chat_template(msgs + [{"role": "assistant", "content": "<think>\nadd\n</think>\n\n#### 5"}],
                                   tokenize=False)
    assert full.endswith("<|im_start|>assistant\n<think>\nadd\n</think>\n\n#### 5<|im_end|>\n")
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, enable_thinking=False)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert tok.decode(ids) == off


def test_arith_rows_score_and_load_in_rlhfdataset(made, tmp_path):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.reward_score import default_compute_score

    out = made[0]
    train = pq.read_table(out / "arith_tiny" / "train.parquet").to_pylist()
    test = pq.read_table(out / "arith_tiny" / "test.parquet").to_pylist()
    assert (len(train), len(test)) == (512, 64)
    assert not {r["extra_info"]["question"] for r in train} & {r["extra_info"]["question"] for r in test}
    for row in train + test:
        assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
        expr = row["extra_info"]["answer"].split(" = ")[0]
        truth = row["reward_model"]["ground_truth"]
        assert str(eval(expr)) == truth  # noqa: S307 - our own "a op b"
        assert row["prompt"][0]["content"].endswith('output the final answer after "####".')
        assert default_compute_score("openai/gsm8k", row["extra_info"]["answer"], truth) == 1.0
    assert any(r["extra_info"]["question"].startswith("What is ") for r in train)

    tok = AutoTokenizer.from_pretrained(out / "tiny-qwen3")
    cfg = OmegaConf.create({"max_prompt_length": 256, "filter_overlong_prompts": True, "truncation": "error",
                            "cache_dir": str(tmp_path / "cache"), "filter_overlong_prompts_workers": 1,
                            "apply_chat_template_kwargs": {"enable_thinking": False}})
    ds = RLHFDataset(str(out / "arith_tiny" / "test.parquet"), tok, cfg)
    assert len(ds) == 64
    truth = ds[0]["reward_model"]["ground_truth"]
    assert default_compute_score("openai/gsm8k", f"step by step...\n#### {truth}", truth) == 1.0
    assert default_compute_score("openai/gsm8k", f"#### {int(truth) + 1}", truth) == 0.0
    # the example the issue names: "What is 23 + 48?" -> 71
    row = tiny.gsm8k_row("What is 23 + 48?", "23 + 48 = 71\n#### 71", "test", 0)
    assert default_compute_score(row["data_source"], "#### 71", row["reward_model"]["ground_truth"]) == 1.0


def test_idempotent_deterministic_and_force(made, tmp_path):
    out = made[0]
    logs: list[str] = []
    tiny.make_tiny(out, ["tiny"], log=logs.append)
    assert all(line.startswith("kept") for line in logs), logs

    again = tmp_path / "again"
    tiny.make_tiny(again, ["tiny"], log=lambda _: None)
    for rel in ("tiny-qwen3/tokenizer.json", "tiny-qwen3/model.safetensors", "arith_tiny/train.parquet"):
        assert (again / rel).read_bytes() == (out / rel).read_bytes(), rel

    before = (again / "tiny-qwen3" / "model.safetensors").stat().st_mtime_ns
    tiny.make_tiny(again, ["tiny"], force=True, log=lambda _: None)
    assert (again / "tiny-qwen3" / "model.safetensors").stat().st_mtime_ns != before
    assert sorted(p.name for p in again.iterdir()) == ["arith_tiny", "tiny-qwen3"]

    logs.clear()  # other settings: rebuilt, not kept
    tiny.make_tiny(again, [], n_train=16, n_test=4, log=logs.append)
    assert logs[0].startswith("wrote") and pq.read_table(again / "arith_tiny" / "test.parquet").num_rows == 4


def test_learn_variant_settings():
    name, arch = tiny.VARIANTS["learn"]
    assert name == "tiny-qwen3-learn"
    assert arch.hidden_size == arch.num_attention_heads * arch.head_dim
    assert arch.vocab_size == tiny.VARIANTS["tiny"][1].vocab_size  # one tokenizer serves both


def test_warmup_trains_saves_and_the_cli_runs(made, tmp_path, capsys):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_lab.tasks import warmup

    out = made[0]
    small = tmp_path / "small"
    small.mkdir()
    for split in ("train", "test"):  # a trivially small set: 8 training rows, 4 test rows
        table = pq.read_table(out / "arith_tiny" / f"{split}.parquet")
        pq.write_table(table.slice(0, 8 if split == "train" else 4), small / f"{split}.parquet")

    torch.set_num_threads(min(2, torch.get_num_threads()))  # at most 2, fewer where the worker's share is less
    metrics = warmup.warmup(str(out / "tiny-qwen3"), str(small), str(tmp_path / "sft"), steps=30, device="cpu",
                            batch_size=8, lr=1e-2, eval_n=4, samples=2, max_new_tokens=8, log=lambda _: None)
    losses = metrics["losses_all"]
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    for key in ("greedy_acc", "sampled_acc", "mixed_groups", "format_rate"):
        assert 0.0 <= metrics["after"][key] <= 1.0

    sft = tmp_path / "sft"
    saved = json.loads((sft / "grpo_lab_warmup.json").read_text())
    assert saved["steps"] == 30 and saved["after"] == metrics["after"]
    model = AutoModelForCausalLM.from_pretrained(sft)
    tok = AutoTokenizer.from_pretrained(sft)
    assert model.dtype == torch.bfloat16 and json.loads((sft / "config.json").read_text())["dtype"] == "bfloat16"
    assert tok.chat_template == tiny.CHAT_TEMPLATE and tok.eos_token == "<|im_end|>"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left

    # the CLI, as the command line, for 5 steps on fresh synthetic problems
    t0 = time.perf_counter()
    rc = warmup.main(["--model", str(out / "tiny-qwen3"), "--data", str(small), "--out", str(tmp_path / "sft5"),
                      "--steps", "5", "--device", "cpu", "--batch-size", "8", "--eval-n", "4", "--samples", "2",
                      "--max-new-tokens", "8", "--synthetic", "64"])
    assert rc == 0 and time.perf_counter() - t0 < 20
    printed = capsys.readouterr().out
    assert "before: greedy acc" in printed and "after:  greedy acc" in printed and "64 fresh synthetic" in printed
    assert (tmp_path / "sft5" / "model.safetensors").is_file()


def test_warmup_cli_errors(tmp_path, capsys):
    from grpo_lab.tasks import warmup

    assert warmup.main(["--model", str(tmp_path), "--data", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "grpo_lab.tasks.tiny" in capsys.readouterr().err
