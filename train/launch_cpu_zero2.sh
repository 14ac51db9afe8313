#!/usr/bin/env bash
# The ZeRO-2 code path on CPU (no GPU needed): one process under torchrun, DeepSpeed's CPU accelerator,
# use_cpu=False (deepspeed=force). Used by tests/test_deepspeed.py; handy to check a recipe's DeepSpeed
# wiring before a GPU run. The first run JIT-builds two DeepSpeed ops (~2-3 min), cached in
# $TORCH_EXTENSIONS_DIR (default <repo>/.cache/torch_extensions, git-ignored).
#
#   train/launch_cpu_zero2.sh RECIPE.yaml [--set key=value ...]
set -euo pipefail
if [[ $# -lt 1 ]]; then
    sed -n '2,8p' "$0"; exit 2
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
RECIPE=$1; shift
PY=${PYTHON:-$REPO/.venv/bin/python}
export DS_ACCELERATOR=cpu
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$REPO/.cache/torch_extensions}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$PY" -m torch.distributed.run --nproc_per_node=1 --master_port="${MASTER_PORT:-29517}" \
    -m clfjudge.cli train --recipe "$RECIPE" --set deepspeed=force "$@"
