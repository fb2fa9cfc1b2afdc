#!/usr/bin/env bash
# Where a GRPO step goes (issue 27): each job alone on the H200 test machine, with verl's own timers (metrics.jsonl),
# the card's utilisation every 0.25 s and py-spy sampling every Ray/vLLM process at 20 Hz (non-blocking: the sampled
# processes are not paused). Run inside the device calls after verl/vLLM/Ray are staged (`source /root/site.env`), from
# a copy of the repo outside the synced checkout (cp -a . /tmp/w). Each phase packs its folder into $OUT/<phase>.tgz.
#
#   bash benchmarks/gpu/speed_session.sh prepare      # random Qwen3-0.6B and 1.7B, tiny arithmetic, SmolLM2, one-shot
#                                                     # arithmetic (NO_SMOL=1: without the last two; SIZES="": no Qwen3)
#   bash benchmarks/gpu/speed_session.sh logprob      # log-probs of 100k tokens: verl's per-token loop vs its fused kernel
#   bash benchmarks/gpu/speed_session.sh passes       # the three training passes of the 1.7B LoRA smoke, the 0.6B and
#                                                     # the 4B smoke, guide vs speed=fused (pass_bench.py; no vLLM)
#   bash benchmarks/gpu/speed_session.sh budgets      # what a micro-batch costs by its size: the update and old
#                                                     # log-prob of the 1.7B LoRA smoke's batch at budgets 3,000-16,384,
#                                                     # checkpointing on/off, packed/padded (budget_bench.py)
#   bash benchmarks/gpu/speed_session.sh smol_default # learn_smollm2, $STEPS steps (4), the preset as it is (the
#                                                     # default speed, conf/speed/fast.yaml: no speed= override)
#   bash benchmarks/gpu/speed_session.sh smol_guide   # the same with speed=guide (the guide's exact speed settings)
#   bash benchmarks/gpu/speed_session.sh smol_budgets # the same with the passes' token budgets x4-5 and no activation
#                                                     # checkpointing (ran 2026-12-04 as "smol_fast": no faster)
#   bash benchmarks/gpu/speed_session.sh smol_fast    # the same with $FAST
#   bash benchmarks/gpu/speed_session.sh smol_fit     # the command `make fit` prints for it: real weights, rewards that
#                                                     # move, so the pair's first losses can be compared (~500 s)
#   bash benchmarks/gpu/speed_session.sh q06_guide    # the guide's smoke on Qwen3-0.6B (random weights), 3 steps
#   bash benchmarks/gpu/speed_session.sh q06_fast     # the same job with $FAST
#   bash benchmarks/gpu/speed_session.sh q17lora_guide  # the guide's smoke on Qwen3-1.7B on an emulated 32 GB card,
#                                                     # with make fit's LoRA (full fine-tuning does not fit there)
#   bash benchmarks/gpu/speed_session.sh q17lora_fast # the same job with $FAST
#   bash benchmarks/gpu/speed_session.sh q17lora_fit  # the command `make fit` prints for the guide's 1.7B smoke there
#                                                     # (its LoRA, then what it adds for time), as printed
#   bash benchmarks/gpu/speed_session.sh q06_fit      # the same for the 0.6B smoke
#   bash benchmarks/gpu/speed_session.sh p17_guide    # the qwen3_1_7b_gsm8k preset (its batch: 128 x 5, 512 + 1024
#                                                     # tokens) on an emulated 32 GB card with make fit's LoRA, the
#                                                     # guide's speed settings, $EXTRA's steps, no validation (2 steps:
#                                                     # ~1,250 s, start-up ~340 s; alone in a session, with staging)
#   bash benchmarks/gpu/speed_session.sh p17_fit      # the command make fit prints for it (2 steps: 684 s, 2026-12-06)
#   bash benchmarks/gpu/speed_session.sh lora_fsdp1   # issue 28 item 9: verl's LoRA example settings (FSDP1,
#                                                     # layered_summon=True, safetensors) on Qwen3-0.6B, 3 steps,
#                                                     # through raw verl (the preflight's lora_fsdp1_adapter refuses it)
#   bash benchmarks/gpu/speed_session.sh bg|collect|stop ...   # as in smollm2_session.sh (session_lib.sh)
# FAST="key=value ..." replaces the settings tried as faster; EXTRA="key=value ..." is added to every job.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/session_lib.sh
read -ra EXTRA_ARGS <<< "${EXTRA:-}"
# the settings tried as faster; batch, group size, lengths, learning rate and loss unchanged. speed=fused: verl's fused
# log-prob (chunks of 512 tokens) instead of its per-token loop, which without flash-attn took 62-75% of each pass
# (2026-12-04); the guide's jobs name speed=guide, so that the pair holds whichever is the default
read -ra FAST_ARGS <<< "${FAST:-speed=fused}"
GUIDE_ARGS=(speed=guide)
BUDGETS=(actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=16384
  actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=16384 ppo_max_token_len_per_gpu=16384
  actor_rollout_ref.model.enable_gradient_checkpointing=false)
SDPA=++actor_rollout_ref.model.override_config.attn_implementation=sdpa
Q06=$PWD/data/qwen3-0.6b-random-weights
Q17=$PWD/data/qwen3-1.7b-random-weights
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PYSPY=$(command -v py-spy || echo /root/site/bin/py-spy)

profile_start() {  # profile_start NAME: card utilisation + py-spy on each new ray::/vLLM process until the job ends
  local name=$1
  setsid nohup nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 250 \
    > "$LOGS/$name.gpu.csv" 2>/dev/null < /dev/null &
  echo $! > "$LOGS/.smi.pid"
  mkdir -p "$LOGS/$name.pyspy"
  setsid nohup bash -c 'seen=" "; while [ ! -f "$1/.stop" ]; do
      for p in $(pgrep -f "^ray::|VLLM|EngineCore"); do case "$seen" in *" $p "*) continue ;; esac; seen="$seen$p "
        t=$(tr "\0" " " < /proc/$p/cmdline 2>/dev/null | cut -c1-60 | tr -c "A-Za-z0-9_.\n-" "_")
        "$2" record --pid "$p" --rate 20 --nonblocking --format raw --output "$1/$t.$p.txt" > /dev/null 2>&1 &
      done; sleep 2; done' _ "$LOGS/$name.pyspy" "$PYSPY" > /dev/null 2>&1 < /dev/null &
}

profile_stop() {  # the samplers write their files when their process ends; give them a moment, then stop them
  touch "$LOGS/$1.pyspy/.stop"; sleep 5
  pkill -INT -f "py-spy record" 2>/dev/null; sleep 3; pkill -9 -f "py-spy record" 2>/dev/null
  kill "$(cat "$LOGS/.smi.pid")" 2>/dev/null; rm -f "$LOGS/.smi.pid"
  gzip -q "$LOGS/$1.pyspy"/*.txt "$LOGS/$1.gpu.csv" 2>/dev/null
}

job() {  # job NAME LIMIT_S run.py-ARGS...: one job alone, profiled, packed with its report
  local name=$1 limit=$2; shift 2
  profile_start "$name"
  timed "$name" "$limit" python3 run.py "$@" "${EXTRA_ARGS[@]}" hydra.run.dir="$LOGS/$name"
  profile_stop "$name"
  python3 -m grpo_lab.after_run.report "$LOGS/$name" > "$LOGS/report_$name.txt" 2>&1
  pack "$name"
}

# the card decides the hardware option (HW=... overrides): the test machine lends an H200 or an H100
case "${HW:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)}" in
  *H100*|h100x1) HW=h100x1 ;;
  *) HW=h200x1 ;;
esac
# the emulation's real card: that hardware option's own size, read from its file
REAL_GB=$(python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['lab']['hardware']['gpu_memory_gb'])" \
  "conf/hardware/$HW.yaml")
SMOL=(experiment=learn_smollm2 hardware=$HW trainer.total_training_steps="${STEPS:-4}")
QS=(experiment=smoke hardware=$HW dataset=arith_tiny model_path="$Q06" "$SDPA")
# the 1.7B smoke on one emulated 32 GB card with the LoRA that `make fit` prints for it (full fine-tuning runs out there)
LORA=(actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=32
  actor_rollout_ref.rollout.load_format=safetensors actor_rollout_ref.actor.strategy=fsdp2)
Q17LORA=(experiment=smoke model=qwen3_1_7b hardware=$HW lab.hardware.gpu_memory_gb=32
  lab.hardware.emulate.real_gpu_memory_gb=$REAL_GB dataset=arith_tiny model_path="$Q17" "$SDPA" "${LORA[@]}")
# the guide's 1.7B preset there: random weights, the tiny arithmetic data; no validation or checkpoint (steps only)
P17=(experiment=qwen3_1_7b_gsm8k hardware=$HW lab.hardware.gpu_memory_gb=32 lab.hardware.emulate.real_gpu_memory_gb=$REAL_GB
  dataset=arith_tiny model_path="$Q17" "$SDPA" trainer.val_before_train=false test_freq=-1 save_freq=-1
  trainer.resume_mode=disable)

fitted() {  # fitted NAME LIMIT_S ARGS...: run the command `make fit` prints for ARGS (its output kept as NAME.fit.txt)
  local name=$1 limit=$2; shift 2
  python3 run.py preflight.fit=true "$@" hydra.run.dir="$LOGS/$name.fit" > "$LOGS/$name.fit.txt" 2>&1
  local cmd; cmd=$(sed -n '/^The command:/{n;p;}' "$LOGS/$name.fit.txt" | sed 's/^ *python run.py //')
  [ -n "$cmd" ] || { echo "$name: make fit printed no command (see $name.fit.txt)"; pack "$name"; return 1; }
  read -ra FIT_ARGS <<< "$cmd"
  job "$name" "$limit" "${FIT_ARGS[@]}"
}

case "${1:-}" in
  prepare)
    for size in ${SIZES-0_6b 1_7b}; do  # SIZES="": a session of SmolLM2 jobs only
      out=$PWD/data/qwen3-${size/_/.}-random-weights
      [ -f "$out/config.json" ] || timed "build_$size" 600 python3 -m grpo_lab.tasks.qwen3_random --size "$size" --out "$out"
    done
    timed tiny 120 python3 -m grpo_lab.tasks.tiny --out data
    if [ -z "${NO_SMOL:-}" ]; then  # NO_SMOL=1: a session of Qwen3 jobs only
      timed smollm2 300 python3 -m grpo_lab.tasks.smollm2 --out data/smollm2-135m-instruct
      timed arith 120 python3 -m grpo_lab.tasks.arith --out data/arith_oneshot
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
    python3 -c "import torch, vllm, ray, verl, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'verl', verl.__version__, 'transformers', transformers.__version__)" 2>/dev/null | tail -1 | tee "$OUT/versions.txt"
    "$PYSPY" --version | tee -a "$OUT/versions.txt"
    pack prepare
    ;;
  logprob)  # the per-token loop against verl's fused kernel, alone (benchmarks/gpu/logprob_bench.py)
    timed logprob 300 python3 benchmarks/gpu/logprob_bench.py --out "$LOGS/logprob_bench.json"
    pack logprob ;;
  passes)  # a whole model's three training passes, guide against speed=fused, in one process (pass_bench.py)
    timed passes_1_7b_lora 300 python3 benchmarks/gpu/pass_bench.py --out "$LOGS/pass_bench_1_7b_lora.json"
    timed passes_0_6b 300 python3 benchmarks/gpu/pass_bench.py --size 0_6b --lora-rank 0 \
      --out "$LOGS/pass_bench_0_6b.json"
    timed passes_4b 300 python3 benchmarks/gpu/pass_bench.py --size 4b --lora-rank 0 --out "$LOGS/pass_bench_4b.json"
    pack passes ;;
  budgets)  # a micro-batch's cost by its size, speed=fused, in one process (budget_bench.py)
    timed budgets_1_7b_lora 480 python3 benchmarks/gpu/budget_bench.py --budgets 3000,8192,16384 --profile 16384 \
      --out "$LOGS/budget_bench_1_7b_lora.json"
    pack budgets ;;
  smol_default) job smol_default 900 "${SMOL[@]}" ;;
  smol_guide) job smol_guide 900 "${SMOL[@]}" "${GUIDE_ARGS[@]}" ;;
  smol_budgets) job smol_budgets 900 "${SMOL[@]}" "${BUDGETS[@]}" ;;
  smol_fast)  job smol_fast 900 "${SMOL[@]}" "${FAST_ARGS[@]}" ;;
  smol_fit)   fitted smol_fit 900 "${SMOL[@]}" ;;
  q06_guide)  job q06_guide 900 "${QS[@]}" "${GUIDE_ARGS[@]}" ;;
  q06_fast)   job q06_fast 900 "${QS[@]}" "${FAST_ARGS[@]}" ;;
  q17lora_guide) job q17lora_guide 900 "${Q17LORA[@]}" "${GUIDE_ARGS[@]}" ;;
  q17lora_fast)  job q17lora_fast 900 "${Q17LORA[@]}" "${FAST_ARGS[@]}" ;;
  q17lora_fit)   fitted q17lora_fit 900 "${Q17LORA[@]}" ;;
  q06_fit)       fitted q06_fit 900 "${QS[@]}" ;;
  p17_guide)     job p17_guide 1500 "${P17[@]}" "${LORA[@]}" "${GUIDE_ARGS[@]}" ;;
  p17_fit)       fitted p17_fit 1500 "${P17[@]}" ;;
  lora_fsdp1)
    # examples/tuning/lora/run_qwen3_8b_fsdp.sh's LoRA on the smoke: whether verl's own settings run with peft >= 0.21
    # (the recorded failure behind lora_fsdp1_adapter had layered_summon=false: benchmarks/gpu/README.md)
    python3 -m grpo_lab.launch.rawcmd --list "${QS[@]}" actor_rollout_ref.model.lora_rank=64 \
      actor_rollout_ref.model.lora_alpha=32 actor_rollout_ref.model.target_modules=all-linear \
      actor_rollout_ref.actor.strategy=fsdp actor_rollout_ref.rollout.layered_summon=true \
      actor_rollout_ref.rollout.load_format=safetensors experiment_name=lora_fsdp1 > "$LOGS/lora_fsdp1_args.txt"
    RAW_ARGS_FILE=$LOGS/lora_fsdp1_args.txt VERL_FILE_LOGGER_PATH=$LOGS/lora_fsdp1.metrics.jsonl \
      timed lora_fsdp1 600 bash benchmarks/gpu/raw_verl.sh
    pack lora_fsdp1
    ;;
  chain|bg|par|collect|stop) common_verb "$0" "$@" ;;
  *) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
esac
