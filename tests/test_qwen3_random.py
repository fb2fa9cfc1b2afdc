"""make qwen3-random (grpo_lab.tasks.qwen3_random): Qwen3 of the real shapes with random weights, offline. Built here at
a reduced size through the real command; the real sizes are checked by their parameter counts without building them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict

import pytest
from conftest import ROOT, planned, run_module, run_py, write_rows

from grpo_lab.facts import load_yaml
from grpo_lab.memory import memplan
from grpo_lab.tasks import qwen3_random as Q

REDUCED = ["--layers", "2", "--hidden", "64", "--intermediate", "128", "--heads", "2", "--kv-heads", "1"]
FOLDER = "data/qwen3-0.6b-random-weights"
# Qwen3's published parameter counts (model cards: total, non-embedding), in billions
PUBLISHED_B = {"0_6b": (0.6, 0.44), "1_7b": (1.7, 1.4), "4b": (4.0, 3.6), "8b": (8.2, 6.95)}
# Qwen's published config.json values for Qwen3 0.6B/1.7B/4B/8B
PUBLISHED = {
    "0_6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, tie_word_embeddings=True),
    "1_7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, tie_word_embeddings=True),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=False),
}


def param_count(arch) -> tuple[int, int]:
    """(all parameters, non-embedding parameters) of a Qwen3ForCausalLM of this architecture: the memory plan's count
    (grpo_lab/memory/memplan_arch.py), whose root is the embeddings, lm_head and the final norm."""
    a = memplan.Arch.from_mapping(asdict(arch))
    return a.params, a.params - a.root_params + arch.hidden_size


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """`python -m grpo_lab.tasks.qwen3_random --size 0_6b <reduced> --out CWD/data/...` (what make qwen3-random runs, at
    a reduced size): (cwd, folder, seconds, stdout)."""
    cwd = tmp_path_factory.mktemp("q3")
    t0 = time.perf_counter()
    proc = run_module("grpo_lab.tasks.qwen3_random", "--size", "0_6b", *REDUCED, "--out", cwd / FOLDER, timeout=300)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    return cwd, cwd / FOLDER, seconds, proc.stdout


def test_the_command_builds_a_marked_bf16_folder_and_says_how_long(built):
    _, folder, seconds, stdout = built
    assert seconds < 120, f"the reduced build took {seconds:.1f}s"
    assert "random weights: memory and speed only" in stdout and "built on cpu in" in stdout
    assert "use it: python run.py model=qwen3_0_6b model_path=" in stdout
    files = {p.name for p in folder.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            Q.STAMP} <= files
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    config = json.loads((folder / "config.json").read_text())
    assert config[Q.MARK_KEY].startswith("random weights: memory and speed only")
    # kept when up to date: the second run writes nothing
    again = run_module("grpo_lab.tasks.qwen3_random", "--size", "0_6b", *REDUCED, "--out", folder)
    assert again.returncode == 0 and f"kept  {folder}/" in again.stdout, again.stdout + again.stderr


def test_the_model_loads_with_the_shapes_of_qwen3config(built):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    folder = built[1]
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    c = model.config
    # Qwen3's facts, kept in the reduced model: vocabulary, head_dim, rope, norm, ids, context, tied embeddings
    assert (c.vocab_size, c.head_dim, c.rms_norm_eps, c.max_position_embeddings) == (151936, 128, 1e-6, 40960)
    rope = getattr(c, "rope_parameters", None) or {"rope_theta": c.rope_theta}
    assert rope["rope_theta"] == 1_000_000
    assert (c.bos_token_id, c.eos_token_id, c.tie_word_embeddings) == (151643, 151645, True)
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads,
            c.num_key_value_heads) == (2, 64, 128, 2, 1)
    want = Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=128, tie_word_embeddings=True)
    with torch.device("meta"):
        ref = Qwen3ForCausalLM(want)
    assert {n: tuple(p.shape) for n, p in model.named_parameters()} == \
        {n: tuple(p.shape) for n, p in ref.named_parameters()}
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as Qwen3-0.6B
    n = sum(p.numel() for p in model.parameters())
    assert n == param_count(Q.arch_for("0_6b", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                         num_attention_heads=2, num_key_value_heads=1))[0]
    w = model.model.layers[0].mlp.up_proj.weight.float()
    assert 0.015 < w.std().item() < 0.025 and abs(w.mean().item()) < 0.002  # transformers' init: normal(0, 0.02)
    assert torch.all(model.model.norm.weight == 1)
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 151645]])).logits.shape == (1, 3, 151936)


def test_the_tokenizer_covers_every_id_and_round_trips(built):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built[1])
    assert len(tok) == 151936
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
                                                     "</think>", "<tool_call>")}
    assert ids == {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<think>": 151667,
                   "</think>": 151668, "<tool_call>": 151657}  # Qwen3's own ids
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = ('Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.\n'
            'Let\'s think step by step and output the final answer after "####".\n\n#### 72 héllo 日本 \t x')
    enc = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(enc) == text
    assert len(enc) < len(text.encode()) / 2  # merges: fewer tokens than half the bytes
    assert tok("4 8")["input_ids"] == tok("4")["input_ids"] + tok(" ")["input_ids"] + tok("8")["input_ids"]
    # every id of the embedding decodes (a random model samples any of them)
    every = list(range(151936))
    tokens = tok.convert_ids_to_tokens(every)
    assert None not in tokens and len(set(tokens)) == 151936
    decoded = tok.batch_decode([[i] for i in every])
    assert all(isinstance(d, str) for d in decoded) and decoded[151935] == "<|reserved_151935|>"
    # <think> (not special, as in Qwen3) stays in decoded text; the reserved ids are special: dropped
    assert tok.decode([151667, 151700, 151668], skip_special_tokens=True) == "<think></think>"


def test_the_chat_template_is_qwen3s(built):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built[1])
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    on = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    off = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert on == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
                  "<|im_start|>assistant\n")
    assert off == on + "<think>\n\n</think>\n\n"
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert ids[0] == 151644
    assert tok.decode(ids) == on


@pytest.mark.parametrize("size", sorted(Q.SIZES))
def test_the_real_sizes_have_qwens_published_shapes_and_counts(size):
    """The four real sizes, not built: conf/model's architecture is Qwen's published config.json, and its parameter
    count (formula, transformers' model on the meta device, the planner's) is Qwen's published one."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    arch = Q.arch_for(size)
    assert {k: getattr(arch, k) for k in PUBLISHED[size]} == PUBLISHED[size]
    assert (arch.head_dim, arch.vocab_size, arch.max_position_embeddings) == (128, 151936, 40960)
    total, body = param_count(arch)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=arch.vocab_size, hidden_size=arch.hidden_size,
                                             intermediate_size=arch.intermediate_size,
                                             num_hidden_layers=arch.num_hidden_layers,
                                             num_attention_heads=arch.num_attention_heads,
                                             num_key_value_heads=arch.num_key_value_heads, head_dim=arch.head_dim,
                                             tie_word_embeddings=arch.tie_word_embeddings))
    assert sum(p.numel() for p in model.parameters()) == total
    group = load_yaml(ROOT / "conf" / "model" / f"{Q.SIZES[size][0]}.yaml")["lab"]["model"]
    assert memplan.Arch.from_mapping(group, source="test").params == pytest.approx(total, rel=1e-3)
    pub_total, pub_body = PUBLISHED_B[size]
    # the model cards round (0.6B: 0.596; non-embedding 6.95B: 6.946): within half of the last digit they give
    for count, pub in ((total, pub_total), (body, pub_body)):
        half_digit = 0.5 * 10 ** -len(str(pub).partition(".")[2])
        assert abs(count / 1e9 - pub) <= half_digit, (size, count, pub)


def test_preflight_plans_the_folder_and_report_says_random_weights(built, tmp_path):
    cwd = built[0]
    train = write_rows(tmp_path / "train.parquet", 64)
    proc = run_py("experiment=smoke", "hardware=h200x1", f"model_path={FOLDER}", f"train_file={train}",
                  f"test_file={train}", "preflight.only=true", "hydra.run.dir=outputs/runs/q3", cwd=cwd)
    assert planned(proc), proc.stdout[-3000:] + proc.stderr[-3000:]
    head = proc.stdout.split("Batch arithmetic")[0]
    assert "random weights: memory and speed only" in head, proc.stdout[:2000]
    job = cwd / "outputs" / "runs" / "q3"
    plan = json.loads((job / "plan.json").read_text())
    assert plan["memory"]["architecture_source"] == f"{FOLDER}/config.json"  # the folder, not Qwen's hub facts
    assert plan["random_weights"].startswith("random weights: memory and speed only")
    assert plan["memory"]["architecture_source"] == f"{FOLDER}/config.json"
    rep = subprocess.run([sys.executable, "-m", "grpo_lab.after_run.report", str(job), "--no-plots"], cwd=cwd,
                         text=True, capture_output=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert rep.returncode == 0, rep.stderr
    assert "[WARN] model: random weights: memory and speed only" in rep.stdout, rep.stdout
