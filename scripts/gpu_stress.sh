#!/usr/bin/env bash
# Randomized replay stress test on a GPU (graphattn.testing.stress): every built-in backend in
# full and breakable graph modes, random bucket sequences, eager steps above the largest bucket
# and above the reserved rows, empty_cache() and sentinel victims around every step, reference
# and bitwise-replay checks. Ops are split into chunks of CHUNK, each a fresh process (a new
# capture and seed); the per-chunk JSON reports go to $OUT and are added up at the end.
#   usage: OUT=dir scripts/gpu_stress.sh [ops_per_backend_and_mode=10000] [chunk=2500]
#   env:   STRESS_SEED (first seed, default random, printed), STRESS_BACKENDS (default: all
#          built-in), STRESS_MODES (default "full breakable"), STRESS_TIME (seconds per chunk
#          and backend-mode, 0 = no limit), STRESS_ARGS (more options, e.g. --sanitize),
#          GRAPHATTN_PLATFORM=hip (HIP graph rules on NVIDIA hardware)
# A run split over several calls: give each call its own STRESS_SEED and the same OUT, then
#   python3 -m graphattn.testing.stress --sum "$OUT"/stress_*.json
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_stress_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
ops="${1:-10000}"
chunk="${2:-2500}"
seed="${STRESS_SEED:-$RANDOM}"
backends="${STRESS_BACKENDS:-flashmla trtllm flashmla_mega torch}"
modes="${STRESS_MODES:-full breakable}"
status=0
echo "stress seed $seed: $ops ops per backend and mode in chunks of $chunk (${GRAPHATTN_PLATFORM:-detected} platform)"
done_ops=0
while [ "$done_ops" -lt "$ops" ]; do
  n=$(( ops - done_ops < chunk ? ops - done_ops : chunk ))
  for b in $backends; do
    # shellcheck disable=SC2086  # STRESS_ARGS and modes are word lists
    python3 -m graphattn.testing.stress --backends "$b" --modes $modes --ops "$n" --seed "$seed" \
      --time-limit "${STRESS_TIME:-0}" ${STRESS_ARGS:-} --json "$OUT/stress_${b}_${seed}.json" \
      >"$OUT/stress_${b}_${seed}.log" 2>&1 || status=1
    # The log prints each row as it finishes and again in its final table: show the table's.
    # shellcheck disable=SC2086
    grep -E "^\| $b " "$OUT/stress_${b}_${seed}.log" | tail -n "$(set -- $modes; echo $#)"
    grep -E "^    " "$OUT/stress_${b}_${seed}.log" | head -8
  done
  done_ops=$(( done_ops + n ))
  seed=$(( seed + 1 ))
done
echo "totals:"
python3 -m graphattn.testing.stress --sum "$OUT"/stress_*.json || status=1
exit $status
