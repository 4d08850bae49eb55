#!/usr/bin/env bash
# The one-call GPU check (issue 26): run on the GPU machine from the repository root, with the wheels of
# scripts/gpu_wheels.sh installed into a target directory on PYTHONPATH (docs/usage.md, "The GPU check"):
#
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site bash scripts/gpu_check.sh
#
# Trains train/configs/gpu.toml (bf16, FSDP2 over one NCCL rank) uninterrupted and killed-and-resumed, compares every
# step, and writes $OUT/gpu_check.json, gpu_check.txt, gpu_check.log and both runs' metrics (OUT defaults to
# runs/gpu_check). Arguments go to `python -m train.gpu_check` (`--device cpu` runs the CPU fallback). The whole check
# runs under `timeout` (GPU_CHECK_TIMEOUT seconds, default 470); the check's own budget is 25 s less, so that it writes
# its report before the timeout strikes. Exit status: the check's (0 ok, 1 mismatch, 2 failed), 124 on the timeout.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TIMEOUT=${GPU_CHECK_TIMEOUT:-470}
export OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# Nothing outside the GPU machine can be reached: no library may wait on a network time-out.
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}
LOG="$OUT/gpu_check.log"

{
  echo "gpu_check.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ), timeout ${TIMEOUT}s, python $($PY -c 'import sys; print(sys.version.split()[0])')"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/  gpu: /'
  fi
} | tee "$LOG"
# Fail in seconds, not minutes, when a package is missing (the wheels not installed, or not on PYTHONPATH).
if ! $PY -c "import datasets, torch, detsampler.index.prepare, train.gpu_check" 2>>"$LOG"; then
  tail -3 "$LOG" >&2
  echo "gpu_check.sh: an import failed; install the wheels of scripts/gpu_wheels.sh and put their target on PYTHONPATH" \
    | tee -a "$LOG" >&2
  exit 2
fi
timeout --signal=TERM --kill-after=20 "$TIMEOUT" \
  $PY -m train.gpu_check --device cuda --budget-s "$((TIMEOUT - 25))" "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "gpu_check.sh: exit $rc" | tee -a "$LOG"
exit "$rc"
