#!/usr/bin/env bash
# GPU checks of grpo-lab on the H200 test machine (one GPU, no network), run inside the device tool's `run` calls
# after verl/vLLM/Ray are staged (benchmarks/gpu/README.md). Each phase writes logs stamped with seconds since launch
# into $OUT/logs, a line per run into $OUT/times.txt, and packs the logs into $OUT/<phase>.tgz.
#
#   bash benchmarks/gpu/h200_session.sh prepare    # byte-compile the staged packages, make tiny (model + data)
#   bash benchmarks/gpu/h200_session.sh before     # run.py, the smoke_tiny job with verl's start-up defaults
#   bash benchmarks/gpu/h200_session.sh raw_before # the same through raw verl
#   bash benchmarks/gpu/h200_session.sh after      # raw verl with the preset's start-up settings, then run.py
#   bash benchmarks/gpu/h200_session.sh sweep      # run.py -m over rollout_gpu_mem_util
#   bash benchmarks/gpu/h200_session.sh memplan    # measured vs planned training-phase memory
#   bash benchmarks/gpu/h200_session.sh bg PHASE... # the phases one after another in a new process session (setsid):
#                                                   # they outlive the device call; results under $BG_OUT
#   bash benchmarks/gpu/h200_session.sh collect S   # wait up to S seconds for the bg chain, copy what is new to $OUT
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/session_lib.sh
PRESET=(experiment=smoke_tiny hardware=h200x1)
# verl's own start-up defaults, for the "before" runs (the preset lowers them for a 3-step check); `before` is
# compared with the sweep's job0 (the preset at util 0.4, also through run.py), so the launcher is the same
VERL_STARTUP_DEFAULTS=(data.dataloader_num_workers=8 reward.num_workers=8 actor_rollout_ref.rollout.agent.num_workers=8
  transfer_queue.backend.SimpleStorage.num_data_storage_units=8 ray_kwargs.ray_init.include_dashboard=null)

# the preset's job through raw verl; its overrides are derived once, before the clock starts (a user would paste them)
export RAW_ARGS_FILE=$OUT/raw_args.txt
raw_run() {  # raw_run NAME LIMIT_S [override ...]: the preset through raw verl, timed, metrics into $LOGS/NAME.metrics.jsonl
  local name=$1 limit=$2; shift 2
  [ -s "$RAW_ARGS_FILE" ] || python3 -m grpo_lab.launch.rawcmd --list "${PRESET[@]}" > "$RAW_ARGS_FILE"
  VERL_FILE_LOGGER_PATH=$LOGS/$name.metrics.jsonl timed "$name" "$limit" bash benchmarks/gpu/raw_verl.sh "$@"
}

case "${1:-}" in
  prepare)
    t0=$(date +%s)
    python3 -m compileall -q -j 16 /root/site >/dev/null 2>&1
    echo "compileall /root/site: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/times.txt"
    python3 -m grpo_lab.tasks.tiny --out data --variant all 2>&1 | tail -5
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
    python3 -c "import torch, vllm, ray, verl, transformers, hydra; print('torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'verl', verl.__version__, 'transformers', transformers.__version__, 'hydra', hydra.__version__)" 2>/dev/null | tail -1 | tee "$OUT/versions.txt"
    ;;
  before)
    timed runpy_before 480 python3 run.py "${PRESET[@]}" "${VERL_STARTUP_DEFAULTS[@]}" hydra.run.dir="$LOGS/runpy_before"
    pack before
    ;;
  raw_before)
    raw_run raw_before 480 "${VERL_STARTUP_DEFAULTS[@]}"
    pack raw_before
    ;;
  after)
    raw_run raw_after 270
    timed runpy_after 270 python3 run.py "${PRESET[@]}" hydra.run.dir="$LOGS/runpy_after"
    pack after
    ;;
  ours)
    timed runpy 300 python3 run.py "${PRESET[@]}" hydra.run.dir="$LOGS/runpy" ${RUN_ARGS:-}
    pack ours
    ;;
  raw)
    raw_run raw 300 ${RAW_ARGS:-}
    pack raw
    ;;
  sweep)
    # job0 (util 0.4) is the preset itself: run.py's twin of the raw verl run of the `after` phase
    timed sweep 800 python3 run.py -m "${PRESET[@]}" rollout_gpu_mem_util="${UTILS:-0.4,0.2,0.6}" \
      ${STEPS:+trainer.total_training_steps=$STEPS} hydra.sweep.dir="$LOGS/sweep"
    pack sweep
    ;;
  memplan)
    timed memplan 300 python3 benchmarks/gpu/memplan_bench.py --out "$LOGS/memplan.json" ${MEMPLAN_ARGS:-}
    pack memplan
    ;;
  raw_after)  # the `after` phase's raw verl run alone (run.py's twin: the sweep's job0)
    raw_run raw_after 300
    pack raw_after
    ;;
  chain|bg|collect|stop) common_verb "$0" "$@" ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
