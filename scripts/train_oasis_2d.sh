#!/usr/bin/env bash
# HyperMorph on neurite-oasis, 2D coronal slices cut from the 3D volumes, NCC or MSE similarity
# (the two variants of the HyperMorph paper). Re-running the script resumes from the newest
# checkpoint in the output folder (exact resume; --steps is the total).
#
# Usage:  scripts/train_oasis_2d.sh [ncc|mse] [more 'hyperreg train' flags]
# Env:    DATA   neurite-oasis folder          (default ../shared/data/neurite-oasis)
#         OUT    run folder                    (default runs/oasis2d-<sim>)
#         STEPS  total steps                   (default 1500: about 5 min on 2 CPU cores)
#         NPROC  processes (torchrun, DDP); --batch-size is per process (default 1)
#
# With 3 or more subjects, subjects are split train/val/test from --seed (split.json) and
# validated at every checkpoint; with the 2 shared subjects every 10th brain slice is held out
# for validation instead (so training sees 136 of the 151 slices). Outputs: model.pt, best.pt
# (best mean validation Dice over λ = 0.1, 0.5, 0.9), val_log.csv, train_log.csv.
set -euo pipefail
SIM=${1:-ncc}
shift || true
DATA=${DATA:-../shared/data/neurite-oasis}
OUT=${OUT:-runs/oasis2d-$SIM}
STEPS=${STEPS:-1500}
NPROC=${NPROC:-1}

args=(train --data "$DATA" --ndim 2 --sim "$SIM" --steps "$STEPS"
      --checkpoint-every 250 --val-every 250 --out "$OUT")
if compgen -G "$OUT/checkpoint_*.pt" > /dev/null; then
    args+=(--resume "$OUT")
fi
if [ "$NPROC" -gt 1 ]; then
    exec torchrun --nproc-per-node "$NPROC" -m hyperreg "${args[@]}" "$@"
fi
exec hyperreg "${args[@]}" "$@"
