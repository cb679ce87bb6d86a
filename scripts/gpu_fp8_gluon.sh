#!/usr/bin/env bash
# What the Gluon FP8 kernel (graphattn/kernels/wgmma_fp8.py) needs on an H200 before it merges:
# the FP8 kernel table (run first and alone, so nothing shares the GPU while it times), the
# kernel's errors against the float64 reference for bf16 and fp16 q (scripts/fp8_gluon_errors.py),
# the FP8 kernel tests (bf16 and fp16 q) and the FP8 conformance suite for flashmla and dispatch
# (side by side), compute-sanitizer memcheck and racecheck of one FP8 flashmla call with bf16
# and with fp16 q (side by side), and the FP8 fuzz sweep. Logs go to $OUT (packed into
# fp8_gluon_logs.tgz after each part, so a call stopped at its limit still returns them); the
# summary is printed.
#   usage: OUT=dir [FP8_PARTS="table errors checks sanitizers fuzz"] scripts/gpu_fp8_gluon.sh
#   (a device call of 10 minutes holds about "table errors checks sanitizers", then "fuzz")
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_fp8_gluon_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
parts=" ${FP8_PARTS:-table errors checks sanitizers fuzz} "
logs="$(mktemp -d)"
status=0
step() {  # step NAME CMD...: run, log, record the exit code (steps may run side by side)
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$logs/$name.log" 2>&1
  echo "$? $((SECONDS - t0))" >"$logs/$name.rc"
}
report() {  # report NAME...: each step's exit code, time and last lines; any failure fails the script
  local name rc secs
  for name; do
    read -r rc secs <"$logs/$name.rc" 2>/dev/null || { rc=missing; secs=?; }
    echo "== $name (rc=$rc, ${secs} s)"; tail -n 4 "$logs/$name.log"
    [ "$rc" = 0 ] || status=1
  done
  tar czf "$OUT/fp8_gluon_logs.tgz" -C "$logs" .
}
want() { [[ "$parts" == *" $1 "* ]]; }

if want table; then
  step table timeout 300 python3 -m graphattn.bench.kernels --kv-dtype fp8 --json "$OUT/bench_fp8.json"
  grep "^|" "$logs/table.log" >"$OUT/bench_fp8.md"
  report table
fi
if want errors; then
  step errors timeout 120 python3 scripts/fp8_gluon_errors.py
  cat "$logs/errors.log"; report errors
fi
if want checks; then
  step tests timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_fp8.py tests/test_backends_fp8.py &
  for b in flashmla dispatch; do
    step "conformance-$b" timeout 300 python3 -m pytest -q -p no:cacheprovider -p graphattn.testing.plugin \
      --pyargs graphattn.testing --graphattn-backend "$b" --graphattn-kv-dtype fp8 &
  done
  wait
  report tests conformance-flashmla conformance-dispatch
fi
if want sanitizers; then
  call="$logs/call.py"
  cat >"$call" <<'PY'
import sys, torch
from graphattn.common.kv_layout import quantize_kv
from graphattn.common.metadata import GraphMetadata
from graphattn.kernels import split_plan, sparse_mla_flashmla
from graphattn.kernels.flashmla import kernel_name
heads, rows, dtype = int(sys.argv[1]), int(sys.argv[2]), getattr(torch, sys.argv[3])
q = torch.randn(rows, heads, 576, device="cuda", dtype=dtype)
kv = quantize_kv(torch.randn(1000, 576, device="cuda"))
idx = torch.randint(-1, 1050, (rows, 300), device="cuda", dtype=torch.int32)  # with out-of-range
md = GraphMetadata(rows, heads, 300, q.dtype, "cuda", **split_plan("flashmla", heads, 300, kv_fp8=True).metadata_kwargs())
out, lse = sparse_mla_flashmla(q, kv, idx, 0.04, *md.workspace_for(rows))
torch.cuda.synchronize()
print(heads, rows, dtype, kernel_name(q, kv, 300), "finite:", bool(out.isfinite().all()))
PY
  for tool in memcheck racecheck; do
    for dt in bfloat16 float16; do
      step "$tool-$dt" timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 3 python3 "$call" 64 3 "$dt" &
    done
  done
  wait
  report memcheck-bfloat16 memcheck-float16 racecheck-bfloat16 racecheck-float16
fi
if want fuzz; then
  OUT="$logs/fuzz" FUZZ_KV=fp8 FUZZ_TIME="${FUZZ_TIME:-120}" MEMCHECK_TIME="${MEMCHECK_TIME:-90}" \
    step fuzz timeout 500 scripts/gpu_fuzz.sh 200 8
  cat "$logs/fuzz.log"; report fuzz
fi
exit $status
