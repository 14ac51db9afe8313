#!/usr/bin/env bash
# The GPU path end to end, in one run of under 8 minutes with no network: on a machine with an NVIDIA GPU and the
# packages a CUDA image has (torch, transformers, onnxruntime-gpu; wheels carried beside the repository are
# installed first with --no-deps), it
#   1. probes the machine (clfjudge.machine: CUDA, bf16 on the GPU, onnxruntime's CUDA provider),
#   2. trains a few steps of a fine-tuned 3-way head in bf16 on CUDA (a tiny random LLaMA, the test fixtures' data),
#   3. trains the default recipe's reader judge (frozen decoder, layer states read in bf16 on CUDA),
#   4. exports the fine-tuned judge and runs the parity gate with --provider cuda,
#   5. scores a batch with the exported judge on CUDA,
# and prints one line per check ("gpu_check CHECK: ok | FAIL | not run: why"). Without a GPU it says so and stops.
#   bash bench/gpu_check.sh [OUT_DIR]      (OUT_DIR default: a temporary directory; $PYTHON picks the interpreter)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${1:-$(mktemp -d)}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export CLFJUDGE_DATA="${CLFJUDGE_DATA:-$PWD/tests/fixtures/data}" CLFJUDGE_EMBEDDING_CACHE="$OUT/embeddings"
for wheel in wheels/*.whl; do  # optional wheels carried with the working tree (no index is reachable there)
  [ -e "$wheel" ] && "$PY" -m pip install -q --no-deps "$wheel" && echo "gpu_check install: $wheel"
done
exec timeout 480 "$PY" bench/gpu_check.py "$OUT"
