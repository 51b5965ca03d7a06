#!/usr/bin/env bash
# Continue the bundled 3D model's recipe (scripts/train_hypermorph_3d.py) on a GPU machine lent by
# the workplace's `device` tool, and bring a float16 model back. That machine has torch but no
# network, and takes the repository plus at most 64 MiB a call; the SimpleITK wheel alone fills
# most of that, so it travels in a call of its own, and the second call must come while the
# machine is still warm (a machine that went back comes bare).
#
#   here, once:  python scripts/pack_3d_device.py        (writes .devpack/ and .devpack-sitk/)
#   call 1:      run(command="bash scripts/device_3d.sh install", carry=[".devpack-sitk"])
#   call 2:      run(command="bash scripts/device_3d.sh train 7", carry=[".devpack"],
#                    timeout_s=600)      (at once after call 1; 7 = minutes of training)
#
# `train MINUTES` runs the recipe on CUDA from the bundled 3D model (--init default) into
# runs/h3d_gpu on the device, stops it with SIGTERM after MINUTES (the run checkpoints and exits),
# and writes to $OUT: hypermorph-3d-gpu.pt (hyperreg.pretrained.export_model of the last
# checkpoint; continue here with --init), train_log.csv, val_log.csv, split.json, train.log.
# Env: BATCH (pairs per step, default the recipe's 1), LR (default the recipe's 5e-6).
# CASCADE=K: every K-th step trains the second network pass (the recipe's --cascade-every; default 0).
# `capacity MINUTES [WIDTHS]` (after `install`, instead of `train`): the capacity study,
# benchmarks/bench_capacity.py, each width (default 1,1.5) from scratch for MINUTES on CUDA;
# writes capacity.md (its table) and each width's train_log.csv / val_log.csv to $OUT. Widths run
# one after the other: MINUTES x widths + about a minute of data loading each must fit the call.
# A dry run on a CPU machine: DEVICE=cpu OUT=/tmp/out bash scripts/device_3d.sh train 1
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=${DEVSITE:-.devsite}  # where the wheels are installed (kept while the machine is warm)
install_wheels() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$@"
}
require_install() {  # the wheels of `install` and of the pack, on PYTHONPATH
    if [ ! -d "$SITE/SimpleITK" ]; then
        echo "device_3d.sh: no SimpleITK in $SITE: run 'install' on this machine first" >&2
        exit 2
    fi
    install_wheels .devpack/whl/*.whl
    export PYTHONPATH="$SITE:$PWD" HYPERREG_DATA=.devpack/data PYTHONUNBUFFERED=1
}
case "${1:-}" in
install)
    install_wheels .devpack-sitk/*.whl
    PYTHONPATH="$SITE" python3 -c "import SimpleITK; print('SimpleITK', SimpleITK.Version())"
    ;;
capacity)
    require_install
    out=${OUT:-runs/device_out}
    mkdir -p "$out"
    python3 benchmarks/bench_capacity.py --widths "${3:-1,1.5}" --minutes "${2:-4}" \
        --device "${DEVICE:-cuda}" --data .devpack/data --out runs/capacity --val-every 500 |
        tee "$out/capacity.md"
    for run in runs/capacity/width_*/; do
        name=$(basename "$run")
        for log in train_log.csv val_log.csv; do
            if [ -f "$run/$log" ]; then cp "$run/$log" "$out/${name}_$log"; fi
        done
    done
    ;;
train)
    minutes=${2:-7}
    require_install
    out=${OUT:-runs/device_out}
    mkdir -p "$out"
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
    args=(--out runs/h3d_gpu --device "${DEVICE:-cuda}")
    [ -n "${BATCH:-}" ] && args+=(--batch-size "$BATCH")
    [ -n "${LR:-}" ] && args+=(--lr "$LR")
    [ -n "${CASCADE:-}" ] && args+=(--cascade-every "$CASCADE")
    set +e
    timeout -s TERM "${minutes}m" python3 scripts/train_hypermorph_3d.py "${args[@]}" 2>&1 |
        tee "$out/train.log"
    set -e
    python3 - "$out" <<'EOF'
import shutil
import sys
from pathlib import Path

from hyperreg.pretrained import export_model
from hyperreg.training.checkpointing import latest_checkpoint

out, run = Path(sys.argv[1]), Path("runs/h3d_gpu")
checkpoint = latest_checkpoint(run)
export_model(checkpoint, out / "hypermorph-3d-gpu.pt")
for name in ("train_log.csv", "val_log.csv", "split.json"):
    if (run / name).is_file():
        shutil.copyfile(run / name, out / name)
print(f"device_3d.sh: exported {checkpoint} to {out / 'hypermorph-3d-gpu.pt'}")
EOF
    ;;
*)
    echo "usage: bash scripts/device_3d.sh install | train [MINUTES] | capacity [MINUTES [WIDTHS]]" >&2
    exit 2
    ;;
esac
