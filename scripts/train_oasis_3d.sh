#!/usr/bin/env bash
# HyperMorph on neurite-oasis 3D volumes (160x192x224), NCC or MSE similarity (the two variants
# of the HyperMorph paper), meant for one or more GPUs. Re-running the script resumes from the
# newest checkpoint in the output folder (exact resume; --steps is the total).
#
# Usage:  scripts/train_oasis_3d.sh [ncc|mse] [more 'hyperreg train' flags, e.g. --crop 128 160 192]
# Env:    DATA   neurite-oasis folder (full release: 414 subjects)  (default ../shared/data/neurite-oasis)
#         OUT    run folder                                         (default runs/oasis3d-<sim>)
#         STEPS  total steps                                        (default 50000)
#         NPROC  GPUs / processes (torchrun, DDP, NCCL); global batch = NPROC x 1 (default 1)
#         AMP    1 = bf16 autocast on CUDA, losses in float32       (default 1)
#
# Subjects are split train/val/test from --seed (10 % / 10 %, written to split.json); validation
# (mean Dice over the 35 aligned_seg35 labels, folding) runs on held-out subjects at every
# checkpoint; best.pt keeps the best mean validation Dice over λ = 0.1, 0.5, 0.9.
# Learning rate 1e-4 and batch 1 follow the usual VoxelMorph 3D setting.
set -euo pipefail
SIM=${1:-ncc}
shift || true
DATA=${DATA:-../shared/data/neurite-oasis}
OUT=${OUT:-runs/oasis3d-$SIM}
STEPS=${STEPS:-50000}
NPROC=${NPROC:-1}
AMP=${AMP:-1}

args=(train --data "$DATA" --ndim 3 --sim "$SIM" --steps "$STEPS" --batch-size 1 --lr 1e-4
      --checkpoint-every 1000 --keep-checkpoints 3 --out "$OUT")
if [ "$AMP" = 1 ]; then
    args+=(--amp)
fi
if compgen -G "$OUT/checkpoint_*.pt" > /dev/null; then
    args+=(--resume "$OUT")
fi
if [ "$NPROC" -gt 1 ]; then
    exec torchrun --nproc-per-node "$NPROC" -m hyperreg "${args[@]}" "$@"
fi
exec hyperreg "${args[@]}" "$@"
