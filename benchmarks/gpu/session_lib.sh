# Shared by the GPU session scripts (h200_session.sh, smollm2_session.sh): sourced, not run. Sets OUT, LOGS, BG_OUT and
# gives each script the same timing, packing and background verbs:
#   timed NAME LIMIT_S CMD...   stamped output in $LOGS/NAME.log (seconds since launch, stamp.py), a line of
#                               rc / wall / steps in $OUT/times.txt, then nothing of the run left holding the GPU
#   pack NAME                   $LOGS -> $OUT/NAME.tgz
#   common_verb VERB ARGS...    chain PHASE... | bg PHASE... | collect S: a chain of the script's phases in a new
#                               process session (setsid) that outlives the call, collected by calls back to back;
#                               stop S: no further phase, the running job ended (SIGTERM) and packed as it ends;
#                               par 'SPEC' 'SPEC'...: several chains at once on the one GPU (a SPEC is phases and
#                               VAR=value words, e.g. 'LRS=3e-5 sweep'; PAUSE=N starts that chain N s later), each in
#                               $BG_OUT/cN, cleaned up when all end
[ -f /root/site.env ] && source /root/site.env
OUT=${OUT:-/tmp/grpo-lab-out}
LOGS=$OUT/logs
BG_OUT=${BG_OUT:-/tmp/grpo-lab-bg}
mkdir -p "$LOGS"
# vLLM's own start-up log lines (verl sets WARN for its workers unless the launching shell sets the variable)
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-INFO}

cleanup() {  # nothing of one run may hold the GPU for the next (not while other chains share the GPU: PAR=1)
  [ "${PAR:-0}" = 1 ] && return 0
  ray stop --force >/dev/null 2>&1
  pkill -9 -f "vllm|EngineCore|raylet|ray::" >/dev/null 2>&1
  sleep 2
}

timed() {
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s.%N)
  # the job's pid for `stop` (exec keeps the subshell's pid)
  ( echo "$BASHPID" > "$LOGS/.job.pid"; exec timeout -k 10 "$limit" "$@" ) </dev/null 2>&1 \
    | python3 benchmarks/gpu/stamp.py "$t0" > "$LOGS/$name.log"
  local rc=${PIPESTATUS[0]}
  rm -f "$LOGS/.job.pid"
  echo "$name rc=$rc wall_s=$(python3 -c "import time; print(round(time.time() - $t0, 1))")" \
    "steps=$(grep -c ' step:[0-9]' "$LOGS/$name.log")" | tee -a "$OUT/times.txt"
  cleanup
}

pack() { tar czf "$OUT/$1.tgz" -C "$LOGS" . && rm -rf "${LOGS:?}"/*; }

common_verb() {  # common_verb SCRIPT VERB ARGS...; returns 1 when VERB is not one of these
  local script=$1 verb=$2; shift 2
  case "$verb" in
    chain)  # the phases in order; `done` marks the end
      for phase in "$@"; do
        [ -f "$OUT/stop" ] && { echo "$phase skipped (stop)" >> "$OUT/chain.txt"; continue; }
        bash "$script" "$phase"; echo "$phase finished" >> "$OUT/chain.txt"
      done
      touch "$OUT/done"
      ;;
    bg)
      mkdir -p "$BG_OUT"
      OUT=$BG_OUT setsid nohup bash "$script" chain "$@" > "$BG_OUT/chain.log" 2>&1 < /dev/null &
      echo "started in the background: $* (results under $BG_OUT)"
      ;;
    par)  # par 'SPEC' ...: each SPEC's phases in order, the SPECs side by side; one cleanup after the last ends
      mkdir -p "$BG_OUT"
      local i=0 spec w vars phases
      for spec in "$@"; do
        i=$((i + 1)); vars=(); phases=()
        for w in $spec; do case "$w" in *=*) vars+=("$w") ;; *) phases+=("$w") ;; esac; done
        mkdir -p "$BG_OUT/c$i"
        echo "c$i: $spec" >> "$BG_OUT/par.txt"
        # PAUSE=N in a SPEC: the chain starts N s later, also without a `pause` phase (on 2026-12-04 the specs had
        # PAUSE= and no `pause`, and all four chains started at once); a chain that begins with `pause` sleeps there
        OUT=$BG_OUT/c$i PAR=1 setsid nohup env "${vars[@]}" bash -c '[ -n "${PAUSE:-}" ] && [ "${1:-}" != pause ] &&
          sleep "$PAUSE"; for p in "${@:1}"; do [ -f "$OUT/stop" ] && continue; bash "$0" "$p";
          echo "$p finished" >> "$OUT/chain.txt"; done; touch "$OUT/done"' "$script" "${phases[@]}" \
          > "$BG_OUT/c$i.log" 2>&1 < /dev/null &
      done
      # the watcher: when every chain is done, one cleanup, then `done` for collect
      OUT=$BG_OUT setsid nohup bash -c 'n=$1; while [ "$(ls "$OUT"/c*/done 2>/dev/null | wc -l)" -lt "$n" ]; do sleep 5; done
        source benchmarks/gpu/session_lib.sh; PAR=0 cleanup; touch "$OUT/done"' _ "$i" > "$BG_OUT/watch.log" 2>&1 < /dev/null &
      echo "started $i chains side by side (results under $BG_OUT/c1 .. c$i)"
      ;;
    stop)  # end the chain(s) where they are, before the device time runs out: no further phase; the running job gets
      # SIGTERM through its timeout and is packed as usual as it ends (py-spy's files included); waits up to S s
      local d end=$(( $(date +%s) + ${1:-60} ))
      for d in "$BG_OUT" "$BG_OUT"/c[0-9]*; do [ -d "$d" ] && touch "$d/stop"; done
      for d in "$BG_OUT"/logs "$BG_OUT"/c[0-9]*/logs; do [ -f "$d/.job.pid" ] && kill -TERM "$(cat "$d/.job.pid")"; done
      while [ ! -f "$BG_OUT/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 2; done
      [ -f "$BG_OUT/done" ] && echo "chain stopped" || echo "chain still ending after ${1:-60} s"
      ;;
    collect)  # wait for the chain(s) up to S seconds, then copy to $OUT what was not delivered yet
      local end=$(( $(date +%s) + ${1:-500} )) f d
      while [ ! -f "$BG_OUT/done" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 3; done
      mkdir -p "$BG_OUT/.delivered"
      # one chain (bg) keeps its files in $BG_OUT, side-by-side chains (par) in $BG_OUT/cN: delivered as cN_<name>
      for d in "$BG_OUT" "$BG_OUT"/c[0-9]*/; do
        d=${d%/}; local tag=""; [ "$d" != "$BG_OUT" ] && tag="$(basename "$d")_"
        for f in "$d"/*.tgz; do
          [ -f "$f" ] && [ ! -f "$BG_OUT/.delivered/$tag$(basename "$f")" ] && cp "$f" "$OUT/$tag$(basename "$f")" \
            && touch "$BG_OUT/.delivered/$tag$(basename "$f")"
        done
        # what a phase still running has so far (its metrics, status and summaries), in case the machine goes back first
        (cd "$d/logs" 2>/dev/null && find . \( -name metrics.jsonl -o -name status.json -o -name 'summary.*' \
          -o -name plan.json -o -name 'overrides.yaml' \) -print0 | tar czf "$OUT/${tag}partial.tgz" --null -T - 2>/dev/null)
        for f in times.txt chain.txt versions.txt; do [ -f "$d/$f" ] && cp "$d/$f" "$OUT/$tag$f"; done
        for f in "$d"/logs/*.log; do [ -f "$f" ] && echo "== $f" && tail -n 3 "$f" | cut -c1-200; done
        [ -f "$d/times.txt" ] && cat "$d/times.txt"
      done
      for f in "$BG_OUT"/chain.log "$BG_OUT"/c*.log; do [ -f "$f" ] && tail -c 3000 "$f" > "$OUT/tail_$(basename "$f")"; done
      cp "$BG_OUT/par.txt" "$OUT/" 2>/dev/null
      [ -f "$BG_OUT/done" ] && echo "chain done"
      ;;
    *) return 1 ;;
  esac
}
