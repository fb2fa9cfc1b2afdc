#!/usr/bin/env bash
# The tiny model's warm-up on one GPU (issue 6, item 6), before GRPO: make the offline data and models, check that
# vLLM loads and runs them, warm the "learn" variant up with grpo_lab.tasks.warmup, and score the result with vLLM the way
# GRPO's rollout samples it (chat template with enable_thinking=False, temperature 1, n draws per prompt).
#
#   source /root/site.env            # on the H200 test machine (../../../shared/device/README.md)
#   bash benchmarks/gpu/warmup_tiny.sh [RESULTS_DIR]
#
# Environment: DATA (default data), STEPS (warm-up steps, default 400), SYNTHETIC (fresh training problems,
# default 20000), SFT (output model, default $DATA/tiny-qwen3-sft). Logs and JSON go to RESULTS_DIR
# (default outputs/warmup_tiny). GRPO then starts from $SFT; its prompts must be rendered with
# data.apply_chat_template_kwargs.enable_thinking=False, as the warm-up's were.
# Seen on the H200 (2026-12-02, vLLM 0.24.0): vLLM engine up in ~20 s for either model (FLASH_ATTN backend, also
# for head_dim 16); warm-up 400 steps in 10 s (28 s with start-up); greedy accuracy 0.00 -> 0.66, vLLM temperature-1
# accuracy 0.49 with 45% of prompts having both right and wrong draws out of 4.
set -euo pipefail
cd "$(dirname "$0")/../.."
RES=${1:-outputs/warmup_tiny}
DATA=${DATA:-data}
STEPS=${STEPS:-400}
SYNTHETIC=${SYNTHETIC:-20000}
SFT=${SFT:-$DATA/tiny-qwen3-sft}
PY=${PYTHON:-python3}
mkdir -p "$RES"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# vllm_score MODEL NAME: greedy and sampled accuracy of MODEL on $DATA/arith_tiny/test.parquet through vLLM
vllm_score() {
  "$PY" - "$1" "$DATA/arith_tiny" "$RES/vllm_$2.json" <<'EOF'
import json, sys, time
t0 = time.perf_counter()
import pyarrow.parquet as pq
from transformers import AutoTokenizer
from vllm import LLM, SamplingParams
from verl.utils.reward_score.gsm8k import compute_score

model, data, out = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(model)
rows = pq.read_table(f"{data}/test.parquet").to_pylist()
prompts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False, enable_thinking=False)
           for r in rows]
# the tokenizer stays on (verl's rollout skips it): this also checks vLLM's detokenizer on our vocabulary
llm = LLM(model=model, enforce_eager=True, gpu_memory_utilization=0.05, max_model_len=1024, seed=0)
t_ready = time.perf_counter()
result = {"model": model, "engine_start_s": round(t_ready - t0, 1), "n_prompts": len(rows)}
for name, params in (("greedy", SamplingParams(temperature=0.0, max_tokens=64)),
                     ("sampled", SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, n=4, max_tokens=64, seed=0))):
    outs = llm.generate(prompts, params)
    scores = [[compute_score(o.text, r["reward_model"]["ground_truth"]) for o in out.outputs]
              for out, r in zip(outs, rows)]
    flat = [s for ss in scores for s in ss]
    mixed = sum(0 < sum(ss) < len(ss) for ss in scores) / len(scores)
    result[name] = {"acc": sum(flat) / len(flat), "mixed_groups": mixed,
                    "mean_tokens": sum(len(o.token_ids) for out in outs for o in out.outputs) / len(flat),
                    "example": outs[0].outputs[0].text}
print(json.dumps(result, indent=1))
json.dump(result, open(out, "w"), indent=1)
EOF
}

echo "== make tiny (all variants)"
{ time "$PY" -m grpo_lab.tasks.tiny --out "$DATA" --variant all; } 2>&1 | tee "$RES/tiny.log"

echo "== vLLM on the random tiny model"
vllm_score "$DATA/tiny-qwen3" tiny-qwen3-random 2>&1 | tail -40 | tee "$RES/vllm_tiny-qwen3-random.log"

echo "== warm-up: $STEPS steps on $SYNTHETIC synthetic problems"
{ time "$PY" -m grpo_lab.tasks.warmup --model "$DATA/tiny-qwen3-learn" --data "$DATA/arith_tiny" --out "$SFT" \
  --steps "$STEPS" --synthetic "$SYNTHETIC" --device cuda; } 2>&1 | tee "$RES/warmup.log"
cp "$SFT/grpo_lab_warmup.json" "$RES/"

echo "== vLLM on the warmed-up model"
vllm_score "$SFT" tiny-qwen3-sft 2>&1 | tail -40 | tee "$RES/vllm_tiny-qwen3-sft.log"
