#!/usr/bin/env bash
# Graph-layer checks on a GPU machine: the CPU graph suites (emulator, HIP rules), the real
# CUDA-graph tests (CUDA segment and HIP rules forced onto CUDA), then the graph benchmark.
# Logs go to $OUT (default ./gpu_graphs_out).
#   usage: scripts/gpu_graphs.sh [bench args...]     e.g. --max-rows 512 --iters 500
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_graphs_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

# -s: the q-pad memory test prints the bytes the bucket graphs hold.
python3 -m pytest -q -s -p no:cacheprovider tests/test_graphs_gpu.py \
  >"$OUT/pytest_graphs_gpu.log" 2>&1 || status=1
grep -E "q-pad held" "$OUT/pytest_graphs_gpu.log"
tail -3 "$OUT/pytest_graphs_gpu.log"

python3 -m pytest -q -p no:cacheprovider tests/test_graphs.py tests/test_emulator.py \
  tests/test_runner.py tests/test_sanitizer.py >"$OUT/pytest_graphs_cpu_suites.log" 2>&1 || status=1
tail -3 "$OUT/pytest_graphs_cpu_suites.log"

for platform in cuda hip; do
  GRAPHATTN_PLATFORM=$platform python3 -m graphattn.bench.graphs "$@" \
    --json "$OUT/bench_graphs_$platform.json" \
    >"$OUT/bench_graphs_$platform.md" 2>"$OUT/bench_graphs_$platform.err" || status=1
  cat "$OUT/bench_graphs_$platform.md"
done
exit $status
