#!/usr/bin/env bash
# Download, here, the wheels that the GPU machine lacks for the trainer and the default index (issue 26), for
# CPython 3.12 on manylinux x86-64, into .whl/ (git-ignored), and print their total size.
#
#   scripts/gpu_wheels.sh [--dry-run] [NAME==VERSION ...]
#
# The GPU machine has torch, numpy, pyarrow, pandas, tokenizers, sentencepiece, tqdm, filelock, xxhash, fsspec,
# huggingface-hub, pyyaml and packaging, but not `datasets` (detsampler.text.corpus builds corpora with it) nor the
# two packages of its that the image lacks (dill, multiprocess). fsspec travels too, pinned to what datasets 5.2.0
# accepts (<= 2026.9.0), whatever the image's version. detsampler itself travels as source (PYTHONPATH=.).
# Extra pins on the command line are added (e.g. pyarrow==26.0.1 if the image's pyarrow were older than datasets'
# >= 24). One version of each: --no-deps, so every dependency is named here.
# --dry-run prints the pins and the pip command without downloading.
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=(
  "datasets==5.2.0"
  "dill==0.4.1"
  "multiprocess==0.70.19"
  "fsspec==2026.9.0"
)
DRY=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    *==*) PINS+=("$arg") ;;
    *) echo "gpu_wheels.sh: unknown argument $arg (expected --dry-run or NAME==VERSION)" >&2; exit 2 ;;
  esac
done
LIMIT_MIB=64
PYTHON=${PYTHON:-python3}
CMD=("$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
     --platform manylinux1_x86_64 -d .whl "${PINS[@]}")
echo "pins: ${PINS[*]}"
if [ "$DRY" = 1 ]; then
  echo "dry run: ${CMD[*]}"
  exit 0
fi
mkdir -p .whl
"${CMD[@]}"
# Keep only the pinned versions (a wheel left from another pin would make `pip install .whl/*.whl` install two).
keep=()
for pin in "${PINS[@]}"; do
  name=${pin%%==*}; version=${pin#*==}
  norm=$(echo "$name" | tr '-' '_' | tr '[:upper:]' '[:lower:]')
  keep+=("$norm-$version-")
done
for f in .whl/*.whl; do
  base=$(basename "$f" | tr '[:upper:]' '[:lower:]')
  ok=0
  for k in "${keep[@]}"; do [[ "$base" == "$k"* ]] && ok=1; done
  [ "$ok" = 1 ] || { echo "removing $f (not pinned)"; rm -f "$f"; }
done
ls -l .whl/*.whl | awk '{printf "  %10d  %s\n", $5, $NF}'
total=$(du -cb .whl/*.whl | tail -1 | cut -f1)
echo "total: $total bytes ($(awk -v b="$total" 'BEGIN{printf "%.1f", b/1048576}') MiB of the ${LIMIT_MIB} MiB a call may carry)"
# The repository's tracked files (~2 MiB) travel beside the wheels, within the same 64 MiB.
if [ "$total" -gt $((56 * 1048576)) ]; then
  echo "gpu_wheels.sh: the wheels leave too little of the ${LIMIT_MIB} MiB a call may carry for the repository" >&2
  exit 1
fi
