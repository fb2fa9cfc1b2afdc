#!/usr/bin/env bash
# The smoke_tiny preset's job through raw verl: `python3 -m verl.trainer.main_ppo` with the overrides that
# grpo_lab.rawcmd derives from the composed config, plus any given here (they win: they come last).
#   bash benchmarks/gpu/raw_verl.sh [override ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
mapfile -t args < <(python3 -m grpo_lab.rawcmd --list experiment=smoke_tiny hardware=h200x1)
exec python3 -m verl.trainer.main_ppo "${args[@]}" "$@"
