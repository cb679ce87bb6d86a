#!/usr/bin/env bash
# What the Gluon FP8 kernel (graphattn/kernels/wgmma_fp8.py) needs on an H200 before it merges:
# the FP8 kernel tests (bf16 and fp16 q), the FP8 conformance suite for flashmla and dispatch,
# compute-sanitizer memcheck and racecheck of one FP8 flashmla call, the FP8 fuzz sweep and the
# FP8 kernel table. Logs go to $OUT (packed into fp8_gluon_logs.tgz); the summary is printed.
#   usage: OUT=dir scripts/gpu_fp8_gluon.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_fp8_gluon_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
logs="$(mktemp -d)"
status=0
step() {  # step NAME CMD...: run, log, print the tail
  local name=$1; shift
  "$@" >"$logs/$name.log" 2>&1 || status=1
  echo "== $name (rc=$?)"; tail -n 4 "$logs/$name.log"
}
step tests timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_fp8.py tests/test_backends_fp8.py
for b in flashmla dispatch; do
  step "conformance-$b" timeout 200 python3 -m pytest -q -p no:cacheprovider -p graphattn.testing.plugin \
    --pyargs graphattn.testing --graphattn-backend "$b" --graphattn-kv-dtype fp8
done
call="$logs/call.py"
cat >"$call" <<'PY'
import sys, torch
from graphattn.common.kv_layout import quantize_kv
from graphattn.common.metadata import GraphMetadata
from graphattn.kernels import split_plan, sparse_mla_flashmla
from graphattn.kernels.flashmla import kernel_name
heads, rows = int(sys.argv[1]), int(sys.argv[2])
q = torch.randn(rows, heads, 576, device="cuda", dtype=torch.bfloat16)
kv = quantize_kv(torch.randn(1000, 576, device="cuda"))
idx = torch.randint(-1, 1050, (rows, 300), device="cuda", dtype=torch.int32)  # with out-of-range
md = GraphMetadata(rows, heads, 300, q.dtype, "cuda", **split_plan("flashmla", heads, 300, kv_fp8=True).metadata_kwargs())
out, lse = sparse_mla_flashmla(q, kv, idx, 0.04, *md.workspace_for(rows))
torch.cuda.synchronize()
print(heads, rows, kernel_name(q, kv, 300), "finite:", bool(out.isfinite().all()))
PY
for tool in memcheck racecheck; do
  step "$tool" timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 3 python3 "$call" 64 3
done
OUT="$logs/fuzz" FUZZ_KV=fp8 FUZZ_TIME=120 MEMCHECK_TIME=90 step fuzz timeout 500 scripts/gpu_fuzz.sh 200 8
step table timeout 300 python3 -m graphattn.bench.kernels --kv-dtype fp8 --json "$OUT/bench_fp8.json"
cp "$logs/table.log" "$OUT/bench_fp8.md"
tar czf "$OUT/fp8_gluon_logs.tgz" -C "$logs" .
exit $status
