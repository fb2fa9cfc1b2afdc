"""use_remove_padding=true without flash-attn (sdpa, eager) is correct only because verl's FSDP engine calls the model
with use_cache=False: transformers then keeps packed sequences apart (attention_mask=None + position_ids that restart
per sequence -> a block-diagonal causal mask). This pins it on CPU with a tiny random Qwen3, through verl's own code
path (verl.workers.utils.padding.left_right_2_no_padding -> FSDPEngineWithLMHead.forward_step ->
prepare_model_inputs / prepare_model_outputs -> logprobs_from_logits -> no_padding_2_padding), so that an upgrade of
verl or transformers that breaks it fails here instead of training on log-probs that leak across sequences.
speed=fused's use_fused_kernels=true (conf/speed/fused.yaml: verl's chunked log-prob + entropy instead of its per-token
loop without flash-attn, benchmarks/gpu/README.md "Where a step goes") is pinned the same way: same log-probs, entropy
and gradients.
"""

from __future__ import annotations

import importlib.util
import types

import pytest
from conftest import ROOT

# torch (and benchmarks/gpu/pass_bench.py, which imports it) only in the tests: collecting the suite, `make test-fast`'s
# too, does not import it


def _pass_bench():
    spec = importlib.util.spec_from_file_location("pass_bench", ROOT / "benchmarks" / "gpu" / "pass_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

PROMPT_LENS = [5, 8, 3, 6]
RESPONSE_LENS = [10, 4, 7, 9]
P, R = max(PROMPT_LENS), max(RESPONSE_LENS)


@pytest.fixture(scope="module")
def setup():
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from tensordict import TensorDict
        from transformers import Qwen3Config, Qwen3ForCausalLM
        from verl.models.transformers.monkey_patch import patch_forward_with_backends
        from verl.utils import tensordict_utils as tu
        from verl.utils.model import compute_position_id_with_mask
        from verl.utils.torch_functional import logprobs_from_logits
        from verl.workers.engine.fsdp import transformer_impl
        from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    torch.manual_seed(0)
    # use_cache left at its default (True), as in Qwen3's config.json: verl's explicit use_cache=False must matter
    cfg = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      attn_implementation="sdpa")
    assert cfg.use_cache
    model = Qwen3ForCausalLM(cfg).eval()

    # the same weights with verl's fused forward (use_fused_kernels=true, impl_backend torch); verl patches the model's
    # class, so a subclass keeps Qwen3ForCausalLM itself untouched for the other tests
    class FusedQwen3(Qwen3ForCausalLM):
        pass

    fused = FusedQwen3(cfg).eval()
    fused.load_state_dict(model.state_dict())
    patch_forward_with_backends(fused, use_fused_kernels=True, fused_kernels_backend="torch")

    # a rollout batch as verl stores it: prompts left-padded, responses right-padded
    prompts = torch.zeros(len(PROMPT_LENS), P, dtype=torch.long)
    responses = torch.zeros(len(PROMPT_LENS), R, dtype=torch.long)
    pmask, rmask = torch.zeros_like(prompts), torch.zeros_like(responses)
    seqs = []
    for i, (pl, rl) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        p, r = torch.randint(1, 512, (pl,)), torch.randint(1, 512, (rl,))
        prompts[i, P - pl:], pmask[i, P - pl:] = p, 1
        responses[i, :rl], rmask[i, :rl] = r, 1
        seqs.append(torch.cat([p, r]))
    attention_mask = torch.cat([pmask, rmask], dim=1)
    td = TensorDict({"input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
                     "position_ids": compute_position_id_with_mask(attention_mask), "response_mask": rmask,
                     "prompts": prompts, "responses": responses}, batch_size=[len(PROMPT_LENS)])
    td = left_right_2_no_padding(td)  # verl: nested (jagged) input_ids / position_ids, padding dropped
    for key, value in {"temperature": 1.0, "use_remove_padding": True, "calculate_entropy": False}.items():
        tu.assign_non_tensor_data(td, key, value)

    # verl's FSDP engine without building FSDP (benchmarks/gpu/pass_bench.py times the same path on the GPU);
    # fp32 on CPU: forward_step skips autocast
    engine_for = _pass_bench().engine_for
    return types.SimpleNamespace(model=model, fused=fused, td=td, seqs=seqs, engine=engine_for(model, "cpu"),
                                 fused_engine=engine_for(fused, "cpu"), impl=transformer_impl, tu=tu,
                                 no_padding_2_padding=no_padding_2_padding, logprobs_from_logits=logprobs_from_logits)


def separate_log_probs(s, i: int, **model_kwargs):
    """Response log-probs of sequence i run on its own (batch of one, no padding), via verl's logprobs_from_logits."""
    import torch

    seq, pl, rl = s.seqs[i], PROMPT_LENS[i], RESPONSE_LENS[i]
    with torch.no_grad():
        logits = s.model(input_ids=seq[None], use_cache=False, **model_kwargs).logits[0]
    return s.logprobs_from_logits(logits[pl - 1: pl + rl - 1], seq[pl: pl + rl])


def test_packed_inputs_are_one_row_with_restarting_positions(setup):
    import torch

    s = setup
    inputs, _ = s.engine.prepare_model_inputs(s.td)
    assert inputs["attention_mask"] is None
    total = sum(PROMPT_LENS) + sum(RESPONSE_LENS)
    assert inputs["input_ids"].shape == (1, total)
    expected = torch.cat([torch.arange(p + r) for p, r in zip(PROMPT_LENS, RESPONSE_LENS)])
    assert torch.equal(inputs["position_ids"][0], expected)


def test_packed_log_probs_equal_separate_ones_through_verls_forward_step(setup, monkeypatch):
    import torch

    s = setup
    # verl picks the device by name; on this CPU-only machine it is the CPU
    monkeypatch.setattr(s.impl, "get_device_id", lambda: "cpu")
    monkeypatch.setattr(s.impl, "get_device_name", lambda: "cpu")
    with torch.no_grad():
        _, output = s.engine.forward_step(s.td, loss_function=None, forward_only=True)
    packed = s.no_padding_2_padding(output["model_output"]["log_probs"], s.td)  # (batch, max response)
    assert packed.shape == (len(PROMPT_LENS), R)
    for i, rl in enumerate(RESPONSE_LENS):
        ref = separate_log_probs(s, i)
        diff = (packed[i, :rl] - ref).abs().max().item()
        assert diff < 1e-4, f"sequence {i}: packed and separate log-probs differ by {diff:.2e}"


def test_the_comparison_detects_sequences_that_see_each_other(setup):
    """Control: the same packed tokens as ONE causal sequence (what packing without the block mask amounts to)
    give clearly different log-probs for every sequence after the first, so the check above has teeth."""
    import torch

    s = setup
    inputs, _ = s.engine.prepare_model_inputs(s.td)
    with torch.no_grad():
        logits = s.model(input_ids=inputs["input_ids"], use_cache=False).logits[0]  # positions 0..T-1, one sequence
    start = 0
    diffs = []
    for i, (pl, rl) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        seq = s.seqs[i]
        lp = s.logprobs_from_logits(logits[start + pl - 1: start + pl + rl - 1], seq[pl: pl + rl])
        diffs.append((lp - separate_log_probs(s, i)).abs().max().item())
        start += pl + rl
    assert diffs[0] < 1e-4  # the first sequence sees nothing before it either way
    assert min(diffs[1:]) > 1e-3, diffs


def _with(s, **flags):
    """A copy of the batch with verl's per-call flags set (the trainer sets them per pass)."""
    td = s.td.clone()
    for key, value in flags.items():
        s.tu.assign_non_tensor_data(td, key, value)
    return td


def _sum_outputs(model_output, data, dp_group):
    """A loss that touches every log-prob and entropy, so that both backward paths are compared."""
    return model_output["log_probs"].values().sum() + model_output["entropy"].values().sum(), {}


def test_fused_kernels_give_the_same_log_probs_entropy_and_gradients(setup, monkeypatch):
    import torch

    s = setup
    monkeypatch.setattr(s.impl, "get_device_id", lambda: "cpu")
    monkeypatch.setattr(s.impl, "get_device_name", lambda: "cpu")
    per_token = _with(s, calculate_entropy=True, use_fused_kernels=False)
    fused = _with(s, calculate_entropy=True, use_fused_kernels=True)
    outputs = {}
    for name, engine, td in (("per_token", s.engine, per_token), ("fused", s.fused_engine, fused)):
        engine.module.zero_grad()
        loss, out = engine.forward_step(td, loss_function=_sum_outputs, forward_only=False)
        loss.backward()
        outputs[name] = (out["model_output"], {n: p.grad.clone() for n, p in engine.module.named_parameters()})
    for key in ("log_probs", "entropy"):
        a, b = (s.no_padding_2_padding(outputs[n][0][key], per_token) for n in ("per_token", "fused"))
        assert (a - b).abs().max().item() < 1e-5, key
    grads, fused_grads = outputs["per_token"][1], outputs["fused"][1]
    assert grads.keys() == fused_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, fused_grads[name], atol=1e-5, rtol=1e-4), name


def test_fused_kernels_skip_the_per_token_loop(setup, monkeypatch):
    """The per-token loop (logprobs_from_logits_v2, verl's path without flash-attn) is what the setting removes."""
    import torch

    s = setup
    monkeypatch.setattr(s.impl, "get_device_id", lambda: "cpu")
    monkeypatch.setattr(s.impl, "get_device_name", lambda: "cpu")
    from verl.utils import torch_functional

    calls = []
    loop = torch_functional.logprobs_from_logits_v2
    monkeypatch.setattr(torch_functional, "logprobs_from_logits_v2", lambda *a, **k: calls.append(1) or loop(*a, **k))
    with torch.no_grad():
        s.engine.forward_step(_with(s, use_fused_kernels=False), loss_function=None, forward_only=True)
        assert calls, "without fused kernels verl's CPU/no-flash-attn path is the per-token loop"
        calls.clear()
        s.fused_engine.forward_step(_with(s, use_fused_kernels=True), loss_function=None, forward_only=True)
    assert not calls


def _responses_and_entropy(model_output, data, dp_group):
    """A loss over the answers' log-probs (a sequence's last position predicts past it: unused) and every entropy."""
    from verl.workers.utils.padding import no_padding_2_padding

    return no_padding_2_padding(model_output["log_probs"], data).sum() + model_output["entropy"].values().sum(), {}


def test_padded_micro_batches_give_the_same_log_probs_entropy_and_gradients(setup, monkeypatch):
    """make fit's padded move (use_remove_padding=false, with the fused log-prob it comes after): verl pads each answer
    to the micro-batch's longest instead of packing them; the answers' log-probs, entropy and gradients are the same."""
    import torch

    s = setup
    monkeypatch.setattr(s.impl, "get_device_id", lambda: "cpu")
    monkeypatch.setattr(s.impl, "get_device_name", lambda: "cpu")
    outputs = {}
    for packed in (True, False):
        td = _with(s, calculate_entropy=True, use_fused_kernels=True, use_remove_padding=packed)
        s.fused_engine.module.zero_grad()
        loss, out = s.fused_engine.forward_step(td, loss_function=_responses_and_entropy, forward_only=False)
        loss.backward()
        outputs[packed] = (s.no_padding_2_padding(out["model_output"]["log_probs"], td),
                           out["model_output"]["entropy"].values(),
                           {n: p.grad.clone() for n, p in s.fused_engine.module.named_parameters()})
    (lp, ent, grads), (lp2, ent2, grads2) = outputs[True], outputs[False]
    assert lp.shape == lp2.shape == (len(PROMPT_LENS), R) and lp.abs().sum() > 0
    assert (lp - lp2).abs().max().item() < 1e-5 and (ent - ent2).abs().max().item() < 1e-5
    assert grads.keys() == grads2.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, grads2[name], atol=1e-5, rtol=1e-4), name
