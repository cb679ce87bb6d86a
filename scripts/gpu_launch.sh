#!/usr/bin/env bash
# The launch path on a GPU (issue 11): its GPU tests (torch.compile fullgraph of every backend,
# kernels, graphs, the cached launcher), the host cost per call of every backend (and the same
# with Triton's own launcher, GRAPHATTN_LAUNCHER=jit), `graphattn bench` at 128 heads (eager /
# full / breakable, with its host-cost lines), the breakable-step profile and the quick kernel
# table. Logs go to $OUT; the tables are printed.
#   usage: OUT=dir scripts/gpu_launch.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu_launch_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
timeout "${TEST_TIME:-240}" python3 -m pytest -q -p no:cacheprovider tests/test_launch_path.py \
  tests/test_kernels_gpu.py tests/test_graphs_gpu.py tests/test_graphs.py tests/test_runner.py \
  >"$OUT/pytest_launch.log" 2>&1 || status=1
tail -3 "$OUT/pytest_launch.log"
python3 -m graphattn.bench.host >"$OUT/host.md" 2>"$OUT/host.err" || status=1
cat "$OUT/host.md"
GRAPHATTN_LAUNCHER=jit python3 -m graphattn.bench.host --backends flashmla,trtllm,flashmla_mega \
  --rows 1 >"$OUT/host_jit.md" 2>>"$OUT/host.err" || status=1
cat "$OUT/host_jit.md"
python3 -m graphattn.cli bench --batch-sizes 1,8,64 --json "$OUT/bench.json" >"$OUT/bench.txt" 2>"$OUT/bench.err" || status=1
cat "$OUT/bench.txt"
python3 scripts/profile_breakable.py >"$OUT/profile_breakable.txt" 2>&1 || status=1
grep -E "us/layer|^segments" "$OUT/profile_breakable.txt"
python3 -m graphattn.bench.kernels --quick --json "$OUT/kernels.json" >"$OUT/kernels.md" 2>"$OUT/kernels.err" || status=1
cat "$OUT/kernels.md"
exit $status
