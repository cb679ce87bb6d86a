#!/usr/bin/env bash
# The GPU checks of flashmla's cluster merge (wgmma_rr with bf16 kv, wgmma_ws with FP8 tokens):
# each fits one device call of at most 10 minutes. Logs go to $OUT (default ./gpu_cluster_out).
#   usage: scripts/gpu_cluster_merge.sh checks   the GPU tests of the merge, scripts/cluster_check.py
#                                                and its memcheck, synccheck and racecheck runs
#                                                (racecheck's hazards triaged: racecheck_triage.py)
#          scripts/gpu_cluster_merge.sh fuzz     the fuzz sweep over both KV layouts, short
#          scripts/gpu_cluster_merge.sh ab       FP8 two-split shapes, cluster merge against the combine
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_cluster_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
case "${1:-}" in
  checks)
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py tests/test_kernels_fp8.py \
      tests/test_dispatch.py >"$OUT/pytest_gpu.log" 2>&1 || status=1
    tail -3 "$OUT/pytest_gpu.log"
    python3 scripts/cluster_check.py >"$OUT/cluster_check.log" 2>&1 || status=1
    grep -E '"ok": false|ALL OK|FAILED' "$OUT/cluster_check.log"
    for tool in memcheck synccheck; do
      timeout 240 compute-sanitizer --tool "$tool" --print-limit 10 python3 scripts/cluster_check.py mem \
        >"$OUT/$tool.log" 2>&1 || status=1
      echo "$tool: $(grep -E 'ERROR SUMMARY|ALL OK|FAILED' "$OUT/$tool.log" | tr '\n' ' ')"
    done
    # racecheck on the merges' CTA-local shared memory, launched without clusters (see the script);
    # every hazard it reports must be a known mbarrier hand-off (scripts/racecheck_triage.py)
    # (racecheck's hazard cap raised as in gpu_racecheck.sh: the FP8 merge's launch reaches the default)
    NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS="${NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS:-50000000}" \
      timeout 240 compute-sanitizer --tool racecheck --print-limit 1000 python3 scripts/cluster_check.py race \
      >"$OUT/racecheck.log" 2>&1; echo "racecheck rc $?: $(grep -E 'RACECHECK SUMMARY|launched' "$OUT/racecheck.log" | tr '\n' ' ')"
    python3 scripts/racecheck_triage.py "$OUT/racecheck.log" || status=1
    ;;
  fuzz)
    FUZZ_KV=both FUZZ_TIME=150 MEMCHECK_TIME=90 OUT="$OUT" scripts/gpu_fuzz.sh 300 4 >"$OUT/fuzz.log" 2>&1 || status=1
    tail -30 "$OUT/fuzz.log"
    ;;
  ab)
    python3 scripts/flashmla_ab.py --kv-fp8 --kernel wgmma_ws --alternate 2 base cluster_merge=0 \
      --shapes 64x64x2048 128x32x2048 64x56x2048 128x28x2048 64x64x8192 >"$OUT/ab.log" 2>&1 || status=1
    grep -E 'us  \(|"ok": false|no result' "$OUT/ab.log"
    ;;
  *)
    echo "usage: $0 checks|fuzz|ab" >&2
    exit 2
    ;;
esac
exit $status
