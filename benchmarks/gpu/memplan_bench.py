"""Measure the training-phase memory of an FSDP actor on one GPU and compare it with grpo_lab.memory.memplan's
prediction.

Builds real Qwen3 architectures (0.6B, 1.7B, 4B; facts from conf/model/*.yaml) from transformers' Qwen3Config with
random weights (no download), shards them with torch FSDP2 on a world of one GPU, bf16 mixed precision with fp32
parameters, gradients and AdamW state (what verl's actor does), and runs GRPO-like steps the way verl's FSDP engine
does: one packed micro-batch of T tokens (sequences of max_prompt + max_response tokens, position_ids restarting per
sequence, attention_mask None, use_cache=False), log-probs by verl's bf16 row-wise path (no flash-attn), a policy-
gradient loss, backward, clip, AdamW step, zero_grad. It records torch.cuda.max_memory_allocated for

  update      forward + backward of the micro-batch (Adam state already there: second step)
  opt_step    the AdamW step (foreach temporaries)
  resident    what stays between phases (params + Adam, or params only when the optimizer is offloaded to RAM
              as verl's optimizer_offload does between phases; gradients freed by zero_grad)
  log_prob    a no-grad forward of T_lp tokens with the entropy, as verl's old-log-prob pass

and prints them beside grpo_lab.memory.memplan's numbers for n_gpus=1 (FSDP over one GPU: per-GPU shares x 1), with the
ratio measured / predicted. Target: within 15% per row.

    python benchmarks/gpu/memplan_bench.py --out memplan_h200.json            # all rows, ~2-4 min on an H200
    python benchmarks/gpu/memplan_bench.py --quick --out quick.json           # 3 rows
    python benchmarks/gpu/memplan_bench.py --device cpu --tiny --out t.json   # seconds, no GPU (CI: wiring only)

Needs torch (with FSDP2: torch >= 2.6), transformers with Qwen3, PyYAML; not verl, not network. See memplan_README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from grpo_lab.memory import memplan  # noqa: E402  (pure Python: no torch)

MODELS = {"0.6b": "qwen3_0_6b", "1.7b": "qwen3_1_7b", "4b": "qwen3_4b", "tiny": "tiny_qwen3"}
GIB = 1 << 30


def load_arch(name: str) -> memplan.Arch:
    """Architecture facts of model=<option> as Hydra composes it (lab.model), the planner's own fallback source."""
    from grpo_lab.facts import conf_option

    option = MODELS.get(name, name)
    return memplan.Arch.from_mapping(conf_option("model", option)["lab"]["model"], source=f"conf/model/{option}.yaml")


def rows_for(args) -> list[dict]:
    """The benchmark matrix: (model, gradient checkpointing, optimizer offload)."""
    if args.tiny:
        return [{"model": "tiny", "gc": True, "offload": False}, {"model": "tiny", "gc": False, "offload": True}]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.quick:
        return [{"model": m, "gc": True, "offload": False} for m in models]
    rows = []
    for m in models:
        for ckpt in (True, False):
            for off in (False, True):
                rows.append({"model": m, "gc": ckpt, "offload": off})
    return rows


def predicted(arch: memplan.Arch, row: dict, args, card_gb: float) -> dict:
    """The planner's numbers for one GPU (FSDP size 1), in bytes."""
    s = memplan.Settings(
        n_gpus=1, card_gb=card_gb, gradient_checkpointing=row["gc"], optimizer_offload=row["offload"],
        attn_implementation=args.attn, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=args.tokens,
        log_prob_use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=args.log_prob_tokens,
        max_prompt_length=args.prompt, max_response_length=args.response, ref_used=False,
        use_torch_compile=args.entropy == "compiled")
    upd = memplan.update_breakdown(arch, s)
    st = memplan.actor_state(arch, s)
    cublas = memplan.CUBLAS_WORKSPACE_GB * memplan.GB  # kept by torch's allocator from the first matmul on
    return {
        "update": sum(upd.values()) + cublas,
        "update_components": upd,
        "update_peak_at": memplan.update_peak_at(arch, s),
        "opt_step": memplan.optimizer_step_bytes(arch, s) + cublas,
        "resident": memplan.resident_between_phases(arch, s) + cublas,
        "log_prob": sum(memplan.training_subphases(arch, s)["old_log_prob"].values()),
        "params": arch.params,
        "actor_state": st.total,
    }


def packed_batch(torch, tokens: int, seq: int, vocab: int, device):
    """One packed micro-batch: sequences of `seq` tokens (the last shorter), position_ids restarting per sequence."""
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (1, tokens), generator=g)
    lens = [seq] * (tokens // seq) + ([tokens % seq] if tokens % seq else [])
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    return ids.to(device), pos.to(device)


def logprobs_rowwise(torch, logits, labels):
    """verl.utils.torch_functional.logprobs_from_logits_v2 for bf16 logits (the path without flash-attn)."""
    out = []
    for row_logits, row_labels in zip(logits, labels):
        row = torch.nn.functional.log_softmax(row_logits, dim=-1)
        out.append(row.gather(dim=-1, index=row_labels.unsqueeze(-1)).squeeze(-1))
    return torch.stack(out)


def entropy_from_logits(logits):
    """verl.utils.torch_functional.entropy_from_logits (verl wraps it in torch.compile(dynamic=True) by default)."""
    import torch

    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


_ENTROPY = {}


def entropy_fn(mode: str, device):
    """The entropy function as verl's actor uses it: compiled (use_torch_compile, the default) or eager; warmed up."""
    if mode not in _ENTROPY:
        import torch

        fn = torch.compile(entropy_from_logits, dynamic=True) if mode == "compiled" else entropy_from_logits
        with torch.no_grad(), torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
            for n in (7, 13):  # compile outside the measured region (two sizes: the dynamic-shape graph)
                fn(torch.randn(n, 4096, device=device, dtype=torch.bfloat16))
        _ENTROPY[mode] = fn
    return _ENTROPY[mode]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(arch: memplan.Arch, row: dict, args) -> dict:
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import Qwen3Config, Qwen3ForCausalLM

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    cfg = Qwen3Config(
        vocab_size=arch.vocab_size, hidden_size=arch.hidden_size, intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers, num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads, head_dim=arch.head_dim,
        tie_word_embeddings=arch.tie_word_embeddings, max_position_embeddings=arch.max_position_embeddings or 40960,
        use_cache=False)
    cfg._attn_implementation = args.attn
    entropy = entropy_fn(args.entropy, dev)
    gc.collect()  # the previous row's model and optimizer hold reference cycles (hooks): free them first
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    t0 = time.time()
    torch.manual_seed(0)
    with torch.device(dev):
        model = Qwen3ForCausalLM(cfg)  # fp32 parameters, random init (verl: fsdp_config.model_dtype fp32)
    if row["gc"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    build_s = time.time() - t0

    ids, pos = packed_batch(torch, args.tokens, args.prompt + args.response, arch.vocab_size, dev)
    labels = torch.roll(ids, shifts=-1, dims=1).squeeze(0)
    adv = torch.randn(args.tokens, device=dev)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def reset():
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak():
        sync()
        return torch.cuda.max_memory_allocated() - base if cuda else None

    def alloc():
        sync()
        return torch.cuda.memory_allocated() - base if cuda else None

    def offload(optimizer, to):
        for state in optimizer.state.values():
            for k, v in state.items():
                if torch.is_tensor(v) and v.dim() > 0:
                    state[k] = v.to(to, non_blocking=True)

    out = {"build_s": round(build_s, 2), "baseline": base}
    times = []
    for step in range(args.steps):
        t = time.time()
        if row["offload"] and step > 0:
            offload(optim, dev)  # verl loads the offloaded optimizer back for the update
        reset()
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            logits = model(input_ids=ids, position_ids=pos, attention_mask=None, use_cache=False).logits.squeeze(0)
            lp = logprobs_rowwise(torch, logits, labels)
            loss = -(lp.float() * adv).mean()
        loss.backward()
        del logits, lp, loss
        upd = peak()
        reset()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        opt = peak()
        optim.zero_grad(set_to_none=True)
        if row["offload"]:
            offload(optim, "cpu")
        res = alloc()
        times.append(time.time() - t)
        out[f"step{step + 1}"] = {"update": upd, "opt_step": opt, "resident": res}
    # old-log-prob pass: no grad, entropy for the metrics, T_lp tokens (an offloaded optimizer stays in RAM: eval mode)
    lp_ids, lp_pos = packed_batch(torch, args.log_prob_tokens, args.prompt + args.response, arch.vocab_size, dev)
    lp_labels = torch.roll(lp_ids, shifts=-1, dims=1).squeeze(0)
    reset()
    with torch.no_grad(), torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
        logits = model(input_ids=lp_ids, position_ids=lp_pos, attention_mask=None, use_cache=False).logits.squeeze(0)
        _ = logprobs_rowwise(torch, logits, lp_labels)
        _ = entropy(logits)
        del logits
    out["log_prob"] = peak()
    out["step_s"] = [round(x, 2) for x in times]
    last = out[f"step{args.steps}"]
    out["measured"] = {"update": last["update"], "opt_step": last["opt_step"], "resident": last["resident"],
                       "log_prob": out["log_prob"]}
    if cuda:
        out["max_reserved"] = torch.cuda.max_memory_reserved()
    del model, optim, ids, pos, labels, adv, lp_ids, lp_pos, lp_labels
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def table(results: list[dict]) -> str:
    head = (f"{'model':>5} {'gc':>3} {'off':>3} {'what':>9} {'measured GiB':>13} {'predicted GiB':>14} {'ratio':>6}")
    lines = [head, "-" * len(head)]
    for r in results:
        for what in ("update", "opt_step", "resident", "log_prob"):
            m = r["measured"].get(what)
            p = r["predicted"][what]
            ratio = f"{m / p:.2f}" if (m is not None and p) else "-"
            ms = f"{m / GIB:.2f}" if m is not None else "-"
            lines.append(f"{r['model']:>5} {('on' if r['gc'] else 'off'):>3} {('on' if r['offload'] else 'off'):>3} "
                         f"{what:>9} {ms:>13} {p / GIB:>14.2f} {ratio:>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file for the results")
    ap.add_argument("--models", default="0.6b,1.7b,4b")
    ap.add_argument("--tokens", type=int, default=3000, help="token budget of one micro-batch (the script's 3000)")
    ap.add_argument("--log-prob-tokens", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--response", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--entropy", default="compiled", choices=["compiled", "eager"],
                    help="the log-prob pass's entropy: torch.compile'd as verl's default, or eager")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="gradient checkpointing on, no offload: one row per model")
    ap.add_argument("--tiny", action="store_true", help="the tiny test model, few tokens (wiring check on CPU)")
    args = ap.parse_args(argv)
    if args.tiny:
        args.tokens, args.log_prob_tokens, args.prompt, args.response = 96, 128, 16, 32

    import torch
    import torch.distributed as dist

    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(0)
        props = torch.cuda.get_device_properties(0)
        card_gb = props.total_memory / memplan.GB
        device_name = props.name
    else:
        card_gb, device_name = 0.0, "cpu"
    started_here = not dist.is_initialized()
    if started_here:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    results = []
    t_all = time.time()
    try:
        for row in rows_for(args):
            arch = load_arch(row["model"])
            pred = predicted(arch, row, args, card_gb)
            meas = measure(arch, row, args)
            r = {**row, "params": arch.params, "tokens": args.tokens, "predicted": pred, **meas}
            results.append(r)
            print(f"{row['model']} gc={row['gc']} offload={row['offload']}: "
                  + ", ".join(f"{k} {v / GIB:.2f} GiB (pred {pred[k] / GIB:.2f})" if v is not None else f"{k} -"
                              for k, v in meas["measured"].items()), flush=True)
    finally:
        if started_here:
            dist.destroy_process_group()
    text = table(results)
    print(text)
    report = {"device": device_name, "card_gb": round(card_gb, 2), "torch": torch.__version__,
              "transformers": __import__("transformers").__version__, "tokens": args.tokens,
              "log_prob_tokens": args.log_prob_tokens, "seq_len": args.prompt + args.response, "attn": args.attn,
              "entropy": args.entropy,
              "constants": {k: getattr(memplan, k) for k in dir(memplan) if k.isupper() and isinstance(
                  getattr(memplan, k), (int, float))},
              "seconds": round(time.time() - t_all, 1), "rows": results, "table": text}
    Path(args.out).write_text(json.dumps(report, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
