#!/usr/bin/env bash
# On a GPU machine: the conformance suite for every backend, with bf16/fp16 KV and with FP8
# tokens (native platform, then HIP rules forced with GRAPHATTN_PLATFORM=hip on NVIDIA), then
# the default `graphattn bench`.
# Logs, JUnit XML and the bench JSON go to $OUT (default ./gpu-out). Runs every step even when
# one fails; the exit status is the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # works with or without `pip install -e .`
BACKENDS="${BACKENDS:-dispatch flashmla trtllm flashmla_mega torch}"
failed=0

step() {  # step NAME CMD...: run, log to $OUT/NAME.log, record the status
  local name=$1; shift
  echo "== $name: $*" | tee -a "$OUT/summary.txt"
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0)) s; tail:" | tee -a "$OUT/summary.txt"
  tail -n 5 "$OUT/$name.log" | sed 's/^/   | /' | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || failed=$((failed + 1))
}

step env python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
step list python -m graphattn list
for b in $BACKENDS; do
  step "check-$b" python -m graphattn check --attn-backend "$b" -v --junitxml "$OUT/check-$b.xml"
  step "check-$b-fp8" python -m graphattn check --attn-backend "$b" --kv-dtype fp8 -v \
    --junitxml "$OUT/check-$b-fp8.xml"
done
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() and not torch.version.hip else 1)"; then
  for b in trtllm flashmla; do
    step "check-hip-rules-$b" env GRAPHATTN_PLATFORM=hip python -m graphattn check --attn-backend "$b" \
      --junitxml "$OUT/check-hip-rules-$b.xml"
  done
fi
step bench python -m graphattn bench --json "$OUT/bench.json"
echo "failed steps: $failed" | tee -a "$OUT/summary.txt"
exit $failed
