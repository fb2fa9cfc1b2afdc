# Shared by the GPU session scripts (h200_session.sh, smollm2_session.sh): sourced, not run. Sets OUT, LOGS, BG_OUT and
# gives each script the same timing, packing and background verbs:
#   timed NAME LIMIT_S CMD...   stamped output in $LOGS/NAME.log (seconds since launch, stamp.py), a line of
#                               rc / wall / steps in $OUT/times.txt, then nothing of the run left holding the GPU
#   pack NAME                   $LOGS -> $OUT/NAME.tgz
#   common_verb VERB ARGS...    chain PHASE... | bg PHASE... | collect S: a chain of the script's phases in a new
#                               process session (setsid) that outlives the call, collected by calls back to back
[ -f /root/site.env ] && source /root/site.env
OUT=${OUT:-/tmp/grpo-lab-out}
LOGS=$OUT/logs
BG_OUT=${BG_OUT:-/tmp/grpo-lab-bg}
mkdir -p "$LOGS"
# vLLM's own start-up log lines (verl sets WARN for its workers unless the launching shell sets the variable)
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-INFO}

cleanup() {  # nothing of one run may hold the GPU for the next
  ray stop --force >/dev/null 2>&1
  pkill -9 -f "vllm|EngineCore|raylet|ray::" >/dev/null 2>&1
  sleep 2
}

timed() {
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" </dev/null 2>&1 | python3 benchmarks/gpu/stamp.py "$t0" > "$LOGS/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$name rc=$rc wall_s=$(python3 -c "import time; print(round(time.time() - $t0, 1))")" \
    "steps=$(grep -c ' step:[0-9]' "$LOGS/$name.log")" | tee -a "$OUT/times.txt"
  cleanup
}

pack() { tar czf "$OUT/$1.tgz" -C "$LOGS" . && rm -rf "${LOGS:?}"/*; }

common_verb() {  # common_verb SCRIPT VERB ARGS...; returns 1 when VERB is not one of these
  local script=$1 verb=$2; shift 2
  case "$verb" in
    chain)  # the phases in order; `done` marks the end
      for phase in "$@"; do bash "$script" "$phase"; echo "$phase finished" >> "$OUT/chain.txt"; done
      touch "$OUT/done"
      ;;
    bg)
      mkdir -p "$BG_OUT"
      OUT=$BG_OUT setsid nohup bash "$script" chain "$@" > "$BG_OUT/chain.log" 2>&1 < /dev/null &
      echo "started in the background: $* (results under $BG_OUT)"
      ;;
    collect)  # wait for the chain up to S seconds, then copy to $OUT what was not delivered yet
      local end=$(( $(date +%s) + ${1:-500} )) f
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
    *) return 1 ;;
  esac
}
