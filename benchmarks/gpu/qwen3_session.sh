#!/usr/bin/env bash
# Qwen3 at its real sizes on the H200 test machine (issue 20): random weights built there from the real configs
# (grpo_lab/tasks/qwen3_random.py: memory and speed only), the guide's smoke, the presets' phases against the plan, an
# emulated 32 GB card, LoRA, DAPO to its end. Run inside the device calls after verl/vLLM/Ray are staged
# (`source /root/site.env`), from a copy of the repo outside the synced checkout (cp -a . /tmp/w). Each phase packs
# its job folder and stamped log into $OUT/<phase>.tgz.
#
#   bash benchmarks/gpu/qwen3_session.sh prepare     # random Qwen3 0.6B + 1.7B ($SIZES), tiny arithmetic data,
#                                                    # SmolLM2 (its wheels staged with verl's) + one-shot arithmetic
#   bash benchmarks/gpu/qwen3_session.sh smoke       # the guide's smoke (experiment=smoke), Qwen3-0.6B, 3 steps
#   bash benchmarks/gpu/qwen3_session.sh p17         # the 1.7B preset at its own batch arithmetic, $STEPS steps (2)
#   bash benchmarks/gpu/qwen3_session.sh p4          # the 4B preset likewise (builds the 4B first)
#   bash benchmarks/gpu/qwen3_session.sh dapo        # smoke_smollm2 variant=dapo alone, to its exit
#   bash benchmarks/gpu/qwen3_session.sh emu_fit     # 32 GB card emulated: the smoke that the plan says fits
#   bash benchmarks/gpu/qwen3_session.sh emu_oom     # 32 GB card emulated: the 1.7B smoke, which the plan says runs out
#   bash benchmarks/gpu/qwen3_session.sh lora_smol   # LoRA, SmolLM2, FSDP2 (also lora_smol_merge, lora_q06, lora_8b)
#   bash benchmarks/gpu/qwen3_session.sh smi         # sample the card's and each process's memory in the background
#   bash benchmarks/gpu/qwen3_session.sh bg|par|collect ...   # as in smollm2_session.sh (session_lib.sh); a par
#                                                    # chain 'PAUSE=150 ...' starts 150 s later
# EXTRA="key=value ..." is added to every run.py command; UTIL and KV_GB (below) are single words, for par chains.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/session_lib.sh
read -ra EXTRA_ARGS <<< "${EXTRA:-}"
# no flash-attn on the machine: torch's sdpa (++: smoke_smollm2 sets it already, and + refuses a key that exists)
SDPA=++actor_rollout_ref.model.override_config.attn_implementation=sdpa
# UTIL=0.2: vLLM's share; KV_GB=20: vLLM's KV cache pinned to 20 GB instead of measured (jobs side by side: a vLLM that
# profiles while a neighbour loads or frees memory gets a wrong cache or refuses to start; results/2026-12-03-qwen3-random)
HW=(hardware=h200x1 "$SDPA" ${UTIL:+rollout_gpu_mem_util=$UTIL}
  ${KV_GB:+"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=${KV_GB}000000000"} "${EXTRA_ARGS[@]}")
ARITH=(dataset=arith_tiny)
Q=$PWD/data/qwen3  # + -<size>-random-weights (grpo_lab/tasks/qwen3_random.py)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

mp() { echo "$Q-$1-random-weights"; }  # mp 0.6b: the folder of that size
build() {  # build SIZE (0.6b, 1.7b, 4b, 8b): the random Qwen3 of that size, once
  [ -f "$(mp "$1")/config.json" ] || timed "build_$1" 900 python3 -m grpo_lab.tasks.qwen3_random --size "${1/./_}" --out "$(mp "$1")"
}

case "${1:-}" in
  prepare)
    for s in ${SIZES:-0.6b 1.7b}; do build "$s"; done
    timed tiny 120 python3 -m grpo_lab.tasks.tiny --out data
    timed smollm2 300 python3 -m grpo_lab.tasks.smollm2 --out data/smollm2-135m-instruct
    timed arith 120 python3 -m grpo_lab.tasks.arith --out data/arith_oneshot
    du -sh data/* | tee "$LOGS/data_sizes.txt"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
    python3 -c "import torch, vllm, ray, verl, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'verl', verl.__version__, 'transformers', transformers.__version__)" 2>/dev/null | tail -1 | tee "$OUT/versions.txt"
    pack prepare
    ;;
  smoke)
    build 0.6b
    timed smoke 600 python3 run.py experiment=smoke "${HW[@]}" "${ARITH[@]}" model_path="$(mp 0.6b)" \
      hydra.run.dir="$LOGS/smoke"
    python3 -m grpo_lab.after_run.report "$LOGS/smoke" > "$LOGS/report_smoke.txt" 2>&1
    pack smoke
    ;;
  p17|p4)
    size=$([ "$1" = p17 ] && echo 1.7b || echo 4b); preset=$([ "$1" = p17 ] && echo qwen3_1_7b_gsm8k || echo qwen3_4b_gsm8k)
    build "$size"
    timed "$1" 1500 python3 run.py experiment="$preset" "${HW[@]}" "${ARITH[@]}" model_path="$(mp "$size")" \
      trainer.total_training_steps="${STEPS:-2}" trainer.val_before_train=false test_freq=-1 save_freq=-1 \
      trainer.resume_mode=disable hydra.run.dir="$LOGS/$1"
    python3 -m grpo_lab.after_run.report "$LOGS/$1" > "$LOGS/report_$1.txt" 2>&1
    pack "$1"
    ;;
  dapo)
    timed dapo 1200 python3 run.py experiment=smoke_smollm2 variant=dapo "${HW[@]}" hydra.run.dir="$LOGS/dapo"
    python3 -m grpo_lab.after_run.report "$LOGS/dapo" > "$LOGS/report_dapo.txt" 2>&1
    pack dapo
    ;;
  emu_fit|emu_oom)
    build 0.6b
    EMU=(lab.hardware.gpu_memory_gb=32 lab.hardware.emulate.real_gpu_memory_gb=139.8)
    # the plan: the smoke on Qwen3-0.6B fits a 32 GB card (training 13.6 GB); on Qwen3-1.7B its training phase does not
    # (36.1 GB: 16 B x 1.72B of actor state alone is 27.5 GB), so the per-process cap must stop it there with CUDA OOM
    if [ "$1" = emu_fit ]; then args=(experiment=smoke model_path="$(mp 0.6b)")
    else build 1.7b; args=(experiment=smoke model=qwen3_1_7b model_path="$(mp 1.7b)" preflight.strict=false); fi
    timed "$1" 900 python3 run.py "${HW[@]}" "${ARITH[@]}" "${EMU[@]}" "${args[@]}" hydra.run.dir="$LOGS/$1"
    python3 -m grpo_lab.after_run.doctor "$LOGS/$1/train.log" > "$LOGS/doctor_$1.txt" 2>&1
    pack "$1"
    ;;
  lora_smol|lora_smol_merge|lora_q06|lora_8b)
    # LoRA on one GPU (benchmarks/gpu/README.md, "LoRA on one GPU: why it failed"): FSDP2, whose LoRA parameter names
    # peft's state dict still matches; lora_smol_merge: verl's FSDP1 default with the adapters merged into the weights
    LORA=(actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=32
      actor_rollout_ref.model.target_modules=all-linear actor_rollout_ref.rollout.load_format=safetensors)
    case "$1" in
      lora_smol) args=(experiment=smoke_smollm2 "${LORA[@]}" actor_rollout_ref.actor.strategy=fsdp2) ;;
      lora_smol_merge) args=(experiment=smoke_smollm2 "${LORA[@]}" actor_rollout_ref.model.lora.merge=true
        actor_rollout_ref.rollout.layered_summon=false) ;;
      lora_q06) build 0.6b; args=(experiment=smoke "${ARITH[@]}" model_path="$(mp 0.6b)" "${LORA[@]}" actor_lr=3e-6
        actor_rollout_ref.actor.strategy=fsdp2) ;;
      lora_8b) build 8b; args=(experiment=smoke "${ARITH[@]}" model=qwen3_8b_lora rollout_tp=1 model_path="$(mp 8b)"
        ${LORA8_ARGS:-}) ;;
    esac
    timed "$1" "${LORA_LIMIT:-600}" python3 run.py "${HW[@]}" "${args[@]}" experiment_name="$1" hydra.run.dir="$LOGS/$1"
    python3 -m grpo_lab.after_run.doctor "$LOGS/$1/train.log" > "$LOGS/doctor_$1.txt" 2>&1
    pack "$1"
    ;;
  pause) sleep "${PAUSE:-120}" ;;  # a chain that starts later (vLLM profiles the card alone); par 'PAUSE=150 dapo' does it too
  smi)  # the card's use every 2 s and each process's every 10 s, into $OUT/smi_*.csv, until the machine goes back
    setsid nohup nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader -l 2 \
      > "$OUT/smi_card.csv" 2>/dev/null < /dev/null &
    setsid nohup nvidia-smi --query-compute-apps=timestamp,pid,process_name,used_memory --format=csv,noheader -l 10 \
      > "$OUT/smi_procs.csv" 2>/dev/null < /dev/null &
    ;;
  chain|bg|par|collect|stop) common_verb "$0" "$@" ;;
  *) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
esac
