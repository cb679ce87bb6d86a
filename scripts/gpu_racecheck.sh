#!/usr/bin/env bash
# racecheck of flashmla's sm_90 Gluon kernels with a verdict: every kernel in one split and in
# several, bf16 kv and FP8 tokens (scripts/racecheck_kernels.py), and the two cluster merges
# (scripts/cluster_check.py race); each log then goes through scripts/racecheck_triage.py, which
# fails on any hazard that is not a known mbarrier hand-off. Logs go to $OUT (default
# ./gpu_racecheck_out). One device call (racecheck slows kernels 10-100x; the cases are small).
#   usage: scripts/gpu_racecheck.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_racecheck_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# racecheck processes at most this many hazards (10 million by default, which the FP8 cluster
# merge's launch reached: its ring's hand-offs alone are millions); the triage fails a capped log
export NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS="${NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS:-50000000}"
status=0
for run in kernels:scripts/racecheck_kernels.py clusters:"scripts/cluster_check.py race"; do
  name="${run%%:*}"
  timeout 280 compute-sanitizer --tool racecheck --print-limit 1000 python3 ${run#*:} >"$OUT/racecheck_$name.log" 2>&1 \
    || status=1
  grep -E "^launched|plans " "$OUT/racecheck_$name.log"
  python3 scripts/racecheck_triage.py "$OUT/racecheck_$name.log" || status=1
done
exit $status
