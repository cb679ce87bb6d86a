#!/usr/bin/env bash
# Everything that needs the GPU, in one go: graph-layer GPU tests and benchmark, then the
# conformance check of every backend and the default `graphattn bench` (scripts/gpu_kernels.sh
# covers the kernels). Logs are packed into $OUT/gpu_logs.tgz (the device tool returns at most
# a few files), and the summaries are printed.
#   usage: OUT=/tmp/out scripts/gpu_all.sh [graphs|backends|all]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
logs="$(mktemp -d)"
what="${1:-all}"
status=0
if [ "$what" = all ] || [ "$what" = graphs ]; then
  OUT="$logs/graphs" scripts/gpu_graphs.sh || status=1
fi
if [ "$what" = all ] || [ "$what" = backends ]; then
  OUT="$logs/backends" scripts/gpu_backends.sh || status=1
fi
mkdir -p "$OUT"
tar czf "$OUT/gpu_logs_$what.tgz" -C "$logs" .
exit $status
