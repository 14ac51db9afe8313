#!/usr/bin/env bash
# Multi-GPU training of one recipe (e.g. the Vicuna rows of train/grid, Table 7: 8 GPUs, ZeRO-2, bf16).
#
#   train/launch_multi_gpu.sh RECIPE.yaml [--set key=value ...]
#   NPROC=8 LAUNCHER=deepspeed train/launch_multi_gpu.sh train/grid/judgelm-vicuna-cls.yaml --set output_dir=runs/x
#
# NPROC     processes (default: the number of visible CUDA devices)
# LAUNCHER  torchrun (default) or deepspeed; the deepspeed launcher passes --local_rank, which
#           `clfjudge train` accepts. DeepSpeed itself is switched by the recipe's `deepspeed` key
#           (auto = on when CUDA is available; config clfjudge/configs/ds_zero2.json).
set -euo pipefail
if [[ $# -lt 1 ]]; then
    sed -n '2,11p' "$0"; exit 2
fi
RECIPE=$1; shift
PY=${PYTHON:-python}
NPROC=${NPROC:-$("$PY" -c 'import torch; print(max(torch.cuda.device_count(), 1))')}
case "${LAUNCHER:-torchrun}" in
    torchrun)  exec "$PY" -m torch.distributed.run --nproc_per_node="$NPROC" -m clfjudge.cli train --recipe "$RECIPE" "$@" ;;
    deepspeed) exec deepspeed --num_gpus "$NPROC" --module clfjudge.cli train --recipe "$RECIPE" "$@" ;;
    *) echo "LAUNCHER must be torchrun or deepspeed, got ${LAUNCHER}" >&2; exit 2 ;;
esac
