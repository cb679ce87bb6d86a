#!/usr/bin/env bash
# Issue 10's sweep on a GPU: the regression shapes, N random cases per backend (every kernel
# path), and a smaller random run under compute-sanitizer memcheck. Each case runs in a worker
# process that is replaced after a crash, so one illegal access never hides the next case.
# Logs and JSON lines go to $OUT (packed into fuzz_logs.tgz); the counts are printed.
#   usage: OUT=dir scripts/gpu_fuzz.sh [cases_per_backend=500] [memcheck_cases_per_backend=30]
#   env:   FUZZ_SEED (default: random, printed), FUZZ_JOBS (workers side by side, default 8),
#          FUZZ_TIME (seconds for the random run, default 420), MEMCHECK_TIME (default 150),
#          FUZZ_KV (KV layouts of the random and memcheck runs: auto, fp8 or both; default both)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_fuzz_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cases="${1:-500}"
mc_cases="${2:-30}"
seed="${FUZZ_SEED:-$RANDOM}"
jobs="${FUZZ_JOBS:-8}"
kv="${FUZZ_KV:-both}"
logs="$(mktemp -d)"
status=0
echo "fuzz seed $seed, $jobs workers"
fuzz() { python3 -m graphattn.testing.fuzz_runner --jobs "$jobs" --quiet "$@"; }

fuzz --regression --json "$logs/regression.jsonl" >"$logs/regression.log" 2>&1 || status=1
tail -9 "$logs/regression.log"

# The runner stops starting cases at FUZZ_TIME and prints the counts of those it ran; the outer
# timeout only guards against a hang (a case has its own timeout too).
timeout "$(( ${FUZZ_TIME:-420} + 300 ))" python3 -m graphattn.testing.fuzz_runner --jobs "$jobs" --quiet \
  --cases "$cases" --seed "$seed" --kv-dtype "$kv" --time-limit "${FUZZ_TIME:-420}" \
  --json "$logs/random.jsonl" >"$logs/random.log" 2>&1 || status=1
grep -E "^\[|^    " "$logs/random.log" | head -40
tail -9 "$logs/random.log"

# memcheck: one sanitizer process per backend, cases in-process (the sanitizer does not follow
# the runner's worker processes), side by side; smaller shapes (it slows kernels 10-100x).
for b in dispatch flashmla trtllm flashmla_mega torch; do
  timeout "${MEMCHECK_TIME:-150}" compute-sanitizer --tool memcheck --print-limit 20 \
    --log-file "$logs/memcheck_$b.log" python3 -m graphattn.testing.fuzz_runner --no-isolate --quiet \
    --backends "$b" --cases "$mc_cases" --seed "$((seed + 1))" --max-work 1000000 --kv-dtype "$kv" \
    --json "$logs/memcheck_$b.jsonl" >"$logs/memcheck_run_$b.log" 2>&1 &
done
wait
for b in dispatch flashmla trtllm flashmla_mega torch; do
  echo "memcheck $b: $(grep -c '"status": "ok"' "$logs/memcheck_$b.jsonl") cases ok of $(grep -c '"case"' "$logs/memcheck_$b.jsonl"), $(grep -h 'ERROR SUMMARY' "$logs/memcheck_$b.log")"
  grep -q "ERROR SUMMARY: 0 errors" "$logs/memcheck_$b.log" || { status=1; head -30 "$logs/memcheck_$b.log"; }
done

tar czf "$OUT/fuzz_logs.tgz" -C "$logs" .
exit $status
