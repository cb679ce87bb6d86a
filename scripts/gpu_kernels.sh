#!/usr/bin/env bash
# Kernel checks on a GPU machine: GPU kernel tests, compute-sanitizer memcheck of each path,
# and the kernel benchmark. Logs go to $OUT (default ./gpu_kernels_out).
#   usage: scripts/gpu_kernels.sh [--quick]     (--quick: four benchmark shapes only)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_kernels_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_kernels_gpu.py \
  >"$OUT/pytest_kernels_gpu.log" 2>&1 || status=1
tail -3 "$OUT/pytest_kernels_gpu.log"

# One small call per path under memcheck: any out-of-bounds or misaligned access is an error.
# flashmla runs three times: 64 rows (on sm_90 the round-schedule Gluon kernel, wgmma_rr), 3 rows
# (too few programs for it: the warp-specialised wgmma_ws) and 1 row (the tokens-major KV_MAJOR
# Triton tile). Both Gluon kernels also run under synccheck (their warpgroups meet at named
# barriers and mbarriers). Not racecheck here: it does not follow mbarrier ordering and
# reports hazards between accesses an mbarrier orders, inside Triton's own warp-specialisation
# code too (docs/benchmarks.md, "warp-specialised kernel"); scripts/gpu_racecheck.sh runs it
# and sorts those from new ones (scripts/racecheck_triage.py).
call="$(mktemp --suffix=.py)"
cat >"$call" <<'PY'
import sys, torch
from graphattn.common.metadata import GraphMetadata
from graphattn.kernels import split_plan, sparse_mla_flashmla, sparse_mla_mega, sparse_mla_trtllm
path, rows = sys.argv[1], int(sys.argv[2])
heads, topk, pool = 64 if path == "flashmla" else 20, 300, 1000
q = torch.randn(rows, heads, 576, device="cuda", dtype=torch.bfloat16)
kv = torch.randn(pool, 576, device="cuda", dtype=torch.bfloat16)
idx = torch.randint(-1, pool + 50, (rows, topk), device="cuda", dtype=torch.int32)  # with out-of-range
plan = split_plan(path, heads, topk)
md = GraphMetadata(rows, heads, topk, q.dtype, "cuda", **plan.metadata_kwargs())
if path == "mega":
    out, lse = sparse_mla_mega(q, kv, idx, 0.04)
elif path == "flashmla":
    from graphattn.kernels.flashmla import kernel_name
    print("flashmla kernel:", kernel_name(q, kv, topk))
    out, lse = sparse_mla_flashmla(q, kv, idx, 0.04, *md.workspace_for(rows))
else:
    out, lse = sparse_mla_trtllm(q, kv, idx, 0.04, md.counter_for(rows), *md.workspace_for(rows))
torch.cuda.synchronize()
print(path, rows, "rows, finite:", bool(out.isfinite().all()), "plan:", plan)
PY
for run in memcheck:flashmla:64 memcheck:flashmla:3 memcheck:flashmla:1 memcheck:trtllm:3 memcheck:mega:3 \
    synccheck:flashmla:64 synccheck:flashmla:3; do
  IFS=: read -r tool path rows <<<"$run"
  log="$OUT/${tool}_${path}_${rows}rows.log"
  compute-sanitizer --tool "$tool" --error-exitcode 3 python3 "$call" "$path" "$rows" >"$log" 2>&1 || status=1
  tail -2 "$log"
done

python3 -m graphattn.bench.kernels "$@" --json "$OUT/bench_kernels.json" \
  >"$OUT/bench_kernels.md" 2>"$OUT/bench_kernels.err" || status=1
cat "$OUT/bench_kernels.md"
exit $status
