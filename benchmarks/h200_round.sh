#!/usr/bin/env bash
# One round of the GPU checks on a lent CUDA machine, in one call of the
# workplace's `run` tool (15 minutes of device time a session, 10 a call).
#
# That machine has torch with CUDA but neither torchrec nor fbgemm, and no
# package downloads. So, on the machine with the repository:
#
#   make gpu-wheels                         # torchrec + fbgemm's CPU wheel -> .whl/
#
# then, through `run` (carry [".whl"], timeout_s ~570):
#
#   bash benchmarks/h200_round.sh trunk     # gpu_check: the compiled trunk, no torchrec
#   bash benchmarks/h200_round.sh real      # GPU tests + bench_gpu --compile (needs .whl)
#
# `trunk` is the figure benchmarks/README.md still lacks (the whole-graph
# compile, "`gpu_check.py`"); `real` runs the GPU tests and compiles the real
# models, TorchRec inputs included. Each step runs under its own `timeout`,
# inside an overall deadline (DEADLINE_S, default 540 s), so a step that hangs
# costs its own limit and not the round. Logs go to $OUT (default out/gpu):
# one file per step, and summary.txt with each step's exit status and the
# lines that carry the figures.
set -uo pipefail
cd "$(dirname "$0")/.."

ROUND=${1:-trunk}
OUT=${OUT:-out/gpu}
DEADLINE_S=${DEADLINE_S:-540}
PYTHON=${PYTHON:-python3}
if [[ $ROUND != trunk && $ROUND != real ]]; then
  echo "usage: $0 trunk|real" >&2
  exit 2
fi
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
START=$(date +%s)
# Dynamo says why it recompiled or broke a graph; the count alone is in the
# scripts' own output.
export TORCH_LOGS=${TORCH_LOGS:-recompiles,graph_breaks}

# step NAME LIMIT_S CMD...: run CMD under `timeout`, never past the deadline.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE_S - ($(date +%s) - START)))
  if ((left < 20)); then
    echo "$name: skipped, ${left} s left of the round" | tee -a "$SUMMARY"
    return
  fi
  ((limit > left)) && limit=$left
  local began=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc $rc in $(($(date +%s) - began)) s (limit $limit s)" | tee -a "$SUMMARY"
  grep -iE "examples/s|examples_per_s|frames compiled|first step|peak memory|passed|failed|error|no cuda" \
    "$OUT/$name.log" | grep -v -e Warning -e "Failed to import" | tail -8 | sed 's/^/    /' | tee -a "$SUMMARY"
}

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PYTHON" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" | tee -a "$SUMMARY"

case "$ROUND" in
trunk)
  # batch 1024, bf16 autocast, stand-in histories of 1-99 events with 1 % at
  # 4,096; compiled first (the missing figure), eager beside it for the ratio.
  step default_compiled 200 "$PYTHON" -m benchmarks.gpu_check --preset default --batch-size 1024 --steps 30
  step default_eager 60 "$PYTHON" -m benchmarks.gpu_check --preset default --batch-size 1024 --steps 20 --no-compile
  step large_compiled 220 "$PYTHON" -m benchmarks.gpu_check --preset large --batch-size 1024 --steps 20
  step large_eager 60 "$PYTHON" -m benchmarks.gpu_check --preset large --batch-size 1024 --steps 10 --no-compile
  ;;
real)
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "real: no wheels in .whl/ (run make gpu-wheels here, carry .whl)" | tee -a "$SUMMARY"
    exit 2
  fi
  SITE=$(mktemp -d)
  step wheels 60 "$PYTHON" -m pip install -q --no-deps --no-index --target "$SITE" .whl/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  step gpu_tests 150 "$PYTHON" -m pytest -q -p no:cacheprovider \
    tests/test_gpu.py tests/test_model_gem.py tests/test_compile.py
  step real_compiled 300 "$PYTHON" -m benchmarks.bench_gpu --presets default \
    --batch-sizes 1024 --precisions bf16 --models gem,dlrm --steps 10 --compile \
    --skip-cpu-peer --skip-jagged --json "$OUT/bench_gpu.json"
  ;;
esac
echo "round $ROUND done in $(($(date +%s) - START)) s" | tee -a "$SUMMARY"
