"""A training pass of verl 0.9.1 on a whole Qwen3 (body and head), guide's settings against speed=fused, in one process.

Each pass goes through verl's own FSDPEngineWithLMHead.forward_step (packed micro-batches, sdpa, no FSDP wrapping:
one GPU) over a rollout batch shaped like the job's: SEQS answers of PROMPT + RESPONSE tokens, split into micro-batches
of at most the pass's token budget, as verl's dynamic batching does. Three passes, each timed after a warm-up:
    old log-prob: no gradient, with entropy (verl's compute_log_prob), budget --log-prob-tokens
    reference:    no gradient, without entropy, budget --ref-tokens
    update:       forward + backward with entropy (one mini-batch of all the answers), budget --update-tokens,
                  activation checkpointing as the presets have it, LoRA with --lora-rank
for use_fused_kernels false (the guide: verl's per-token loop without flash-attn) and true (speed=fused, verl's
FusedLinearForPPO), and prints the ratio. The defaults are the guide's smoke on Qwen3-1.7B with `make fit`'s LoRA
(32 x 4 answers, prompts ~35 tokens, answers to 512, budgets 4,096 / 8,192 / 3,000). On the GPU test machine:

    python3 benchmarks/gpu/pass_bench.py --out $OUT/pass_bench.json
    python3 benchmarks/gpu/pass_bench.py --size tiny --seqs 8 --response 64    # seconds on a CPU: the script runs
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def build(size: str, lora_rank: int, fused: bool, dev: str, checkpointing: bool = True):
    """A random Qwen3 of the size's architecture (conf/model), bf16 on the GPU, patched as verl patches it."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from verl.models.transformers.monkey_patch import patch_forward_with_backends

    from grpo_lab.tasks import qwen3_random, tiny

    arch = tiny.VARIANTS["tiny"][1] if size == "tiny" else qwen3_random.arch_for(size)
    cfg = Qwen3Config(**{k: getattr(arch, k) for k in arch.__dataclass_fields__}, attn_implementation="sdpa")
    cls = type("FusedQwen3" if fused else "LoopQwen3", (Qwen3ForCausalLM,), {})  # verl patches the class
    torch.manual_seed(0)
    with torch.device(dev):
        model = cls(cfg).to(torch.bfloat16 if dev == "cuda" else torch.float32)
    patch_forward_with_backends(model, use_fused_kernels=fused, fused_kernels_backend="torch")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        model.enable_input_require_grads()  # as verl does for LoRA
        model = get_peft_model(model, LoraConfig(r=lora_rank, lora_alpha=32, target_modules="all-linear"))
    return model, cfg


def engine_for(module, dev: str):
    """verl's FSDP engine for a language model without building FSDP: the attributes its forward path reads."""
    from verl.utils.torch_functional import entropy_from_logits
    from verl.workers.engine.fsdp import transformer_impl

    engine = object.__new__(transformer_impl.FSDPEngineWithLMHead)
    engine.module = module
    engine._autocast_dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    engine.pad_to_length, engine.pad_to_length_bucket = False, 1024
    engine.use_ulysses_sp, engine.ulysses_sequence_parallel_size, engine.pass_packed_cu_seqlens = False, 1, False
    engine.ulysses_device_mesh = None
    engine.engine_config = types.SimpleNamespace(entropy_checkpointing=False, entropy_from_logits_with_chunking=False,
                                                 entropy_from_logits_chunk_size=2048)
    engine.compute_entropy_from_logits = entropy_from_logits
    return engine


def micro_batches(seqs: int, prompt: int, response: int, budget: int, vocab: int, dev: str, seed: int = 0,
                  remove_padding: bool = True):
    """The rollout batch as verl stores it (prompts left-padded, answers right-padded; answer lengths spread from a
    quarter of RESPONSE to RESPONSE), cut into packed micro-batches of at most `budget` tokens by verl's own dynamic
    batching (seqlen_balancing.rearrange_micro_batches, as its engine does with use_dynamic_bsz). remove_padding=False:
    verl's engine pads each micro-batch to its longest answer instead of packing it (model.use_remove_padding=false)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.utils.model import compute_position_id_with_mask
    from verl.utils.seqlen_balancing import rearrange_micro_batches
    from verl.workers.utils.padding import left_right_2_no_padding

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(max(1, response // 4), response + 1, (seqs,), generator=g)
    prompts = torch.randint(1, vocab, (seqs, prompt), generator=g)
    rmask = (torch.arange(response)[None, :] < lens[:, None]).long()
    responses = torch.randint(1, vocab, (seqs, response), generator=g) * rmask
    mask = torch.cat([torch.ones(seqs, prompt, dtype=torch.long), rmask], dim=1)
    batch = TensorDict({"input_ids": torch.cat([prompts, responses], 1), "attention_mask": mask,
                        "position_ids": compute_position_id_with_mask(mask), "response_mask": rmask,
                        "prompts": prompts, "responses": responses}, batch_size=[seqs])
    out = []
    for td in rearrange_micro_batches(batch, max_token_len=budget)[0]:
        tokens = int(td["attention_mask"].sum())
        td = left_right_2_no_padding(td.to(dev))
        for key, value in {"temperature": 1.0, "use_remove_padding": remove_padding}.items():
            tu.assign_non_tensor_data(td, key, value)
        out.append((td, tokens))
    return out


def _loss(model_output, data, dp_group):
    return model_output["log_probs"].values().float().mean() + 0.0 * model_output["entropy"].values().float().mean(), {}


def run_pass(engine, batches, fused: bool, entropy: bool, train: bool, dev: str) -> float:
    from verl.utils import tensordict_utils as tu

    def once():
        for td, _ in batches:
            tu.assign_non_tensor_data(td, "calculate_entropy", entropy)
            tu.assign_non_tensor_data(td, "use_fused_kernels", fused)
            if train:
                loss, _ = engine.forward_step(td, loss_function=_loss, forward_only=False)
                loss.backward()
            else:
                with torch.no_grad():
                    engine.forward_step(td, loss_function=None, forward_only=True)
        if train:
            engine.module.zero_grad(set_to_none=True)
    return seconds_after_warmup(once, dev)


def seconds_after_warmup(once, dev: str) -> float:
    """Seconds of once() run a second time (the first warms the allocator and torch.compile's shapes)."""
    once()
    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    once()
    if dev == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def batch_args(doc: str) -> argparse.ArgumentParser:
    """The model and rollout batch arguments both pass benches take (the smoke's 1.7B LoRA batch by default)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--size", default="1_7b", help="0_6b, 1_7b, 4b (conf/model's Qwen3 shapes) or tiny")
    ap.add_argument("--lora-rank", type=int, default=64)
    ap.add_argument("--seqs", type=int, default=128, help="answers a step (smoke: 32 prompts x 4)")
    ap.add_argument("--prompt", type=int, default=35)
    ap.add_argument("--response", type=int, default=512)
    return ap


def device() -> str:
    """cuda where there is one; on a CPU-only machine verl is told its device is the CPU."""
    if torch.cuda.is_available():
        return "cuda"
    from verl.workers.engine.fsdp import transformer_impl
    transformer_impl.get_device_id = transformer_impl.get_device_name = lambda: "cpu"
    return "cpu"


def main(argv: list[str] | None = None) -> int:
    ap = batch_args(__doc__)
    ap.add_argument("--log-prob-tokens", type=int, default=4096)
    ap.add_argument("--ref-tokens", type=int, default=8192)
    ap.add_argument("--update-tokens", type=int, default=3000)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    dev = device()
    passes = {"old_log_prob": (a.log_prob_tokens, True, False), "reference": (a.ref_tokens, False, False),
              "update": (a.update_tokens, True, True)}
    res = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__,
           "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}, "passes": {}}
    batches = {}  # the same micro-batches for both settings
    for fused in (False, True):
        model, cfg = build(a.size, a.lora_rank, fused, dev)
        engine = engine_for(model, dev)
        for name, (budget, entropy, train) in passes.items():
            if name not in batches:
                batches[name] = micro_batches(a.seqs, a.prompt, a.response, budget, cfg.vocab_size, dev)
                res["passes"][name] = {"micro_batches": len(batches[name]),
                                       "tokens": sum(t for _, t in batches[name])}
            s = run_pass(engine, batches[name], fused, entropy, train, dev)
            res["passes"][name]["fused_s" if fused else "guide_s"] = s
        del model, engine
        if dev == "cuda":
            torch.cuda.empty_cache()
    print(f"{res['device']}: Qwen3 {a.size}, LoRA r{a.lora_rank}, {a.seqs} answers of {a.prompt} + <= {a.response}"
          " tokens")
    for name, row in res["passes"].items():
        row["ratio"] = row["guide_s"] / row["fused_s"]
        print(f"  {name:13s} {row['tokens']:>7,} tokens in {row['micro_batches']:>3} micro-batches: guide "
              f"{row['guide_s']:6.2f} s, speed=fused {row['fused_s']:6.2f} s = {row['ratio']:.1f}x", flush=True)
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
