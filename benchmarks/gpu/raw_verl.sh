#!/usr/bin/env bash
# The smoke_tiny preset's job through raw verl: `python3 -m verl.trainer.main_ppo` with the overrides that
# grpo_lab.launch.rawcmd derives from the composed config, plus any given here (they win: they come last).
#   bash benchmarks/gpu/raw_verl.sh [override ...]
# RAW_ARGS_FILE: a file of those overrides, one per line (`python3 -m grpo_lab.launch.rawcmd --list ...`), made beforehand
# so that a timed run pays only for verl.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ -n "${RAW_ARGS_FILE:-}" ] && [ -s "$RAW_ARGS_FILE" ]; then
  mapfile -t args < "$RAW_ARGS_FILE"
else
  mapfile -t args < <(python3 -m grpo_lab.launch.rawcmd --list experiment=smoke_tiny hardware=h200x1)
fi
exec python3 -m verl.trainer.main_ppo "${args[@]}" "$@"
