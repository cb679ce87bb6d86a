#!/usr/bin/env bash
# Issue 15 on a machine with two GPUs (two H200s): the device-index tests, `graphattn bench --tp 2`
# in eager/full/breakable (spawned, and under torchrun), a single-GPU run of the same heads for
# comparison, and the conformance suite on cuda:1 (cuda:0 current). Logs go to $OUT
# (default ./gpu_tp_out).
#   usage: scripts/gpu_tp.sh [--quick]     (--quick: bench at 1,8,64 rows only)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_tp_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
bench_extra=()
[ "${1:-}" = "--quick" ] && bench_extra+=(--batch-sizes 1,8,64)

gpus="$(python3 -c 'import torch; print(torch.cuda.device_count())')"
echo "GPUs visible: $gpus" | tee "$OUT/gpus.txt"
nvidia-smi topo -m >>"$OUT/gpus.txt" 2>&1 || rocm-smi --showtopo >>"$OUT/gpus.txt" 2>&1 || true
[ "$gpus" -ge 2 ] || { echo "needs two GPUs"; exit 1; }

# 1. Device-index safety (multi_gpu tests), the TP bench test, the launch path, real graphs.
python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py tests/test_bench_tp.py \
  tests/test_graphs_gpu.py tests/test_launch_path.py >"$OUT/pytest_multi_gpu.log" 2>&1 || status=1
tail -3 "$OUT/pytest_multi_gpu.log"

# 2. graphattn bench --tp 2 (spawned): 128 heads = 64 per rank, all three modes, NCCL all-reduce
#    in the captured step; then a single-GPU run of all 128 heads and one of 64 heads (a rank's
#    share) for the times, and torchrun as the launcher.
for backend in auto trtllm; do
  python3 -m graphattn bench --tp 2 --attn-backend "$backend" "${bench_extra[@]}" \
    --json "$OUT/bench_tp2_$backend.json" >"$OUT/bench_tp2_$backend.md" 2>"$OUT/bench_tp2_$backend.err" || status=1
  tail -30 "$OUT/bench_tp2_$backend.md"
done
python3 -m graphattn bench "${bench_extra[@]}" --json "$OUT/bench_tp1_128.json" \
  >"$OUT/bench_tp1_128.md" 2>"$OUT/bench_tp1_128.err" || status=1
python3 -m graphattn bench --heads 64 "${bench_extra[@]}" --json "$OUT/bench_tp1_64.json" \
  >"$OUT/bench_tp1_64.md" 2>"$OUT/bench_tp1_64.err" || status=1
torchrun --standalone --nproc-per-node 2 -m graphattn bench --tp 2 --batch-sizes 1,8,64 \
  --json "$OUT/bench_tp2_torchrun.json" >"$OUT/bench_tp2_torchrun.md" 2>"$OUT/bench_tp2_torchrun.err" || status=1
tail -5 "$OUT/bench_tp2_torchrun.md"

# 3. The conformance suite on cuda:1 while cuda:0 is current (real shapes, every built-in backend).
python3 -m graphattn check --device cuda:1 --junitxml "$OUT/conformance_cuda1.xml" \
  >"$OUT/conformance_cuda1.log" 2>&1 || status=1
tail -3 "$OUT/conformance_cuda1.log"
exit $status
