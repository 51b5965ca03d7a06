#!/usr/bin/env bash
# How the bundled 3D model (hyperreg/pretrained/hypermorph-3d.pt) was made, step by step, from
# ../shared/data. OAS1_0002 is held out (the moving person of the 3D benchmark); the training
# people are OAS1_0001 and the two LapIRN people. Re-running a step resumes where it stopped.
#
# Usage:  scripts/train_bundled_3d.sh            (CPU; about 2 h on 2 cores)
# Env:    SHARED  the shared data folder (default ../shared/data)
#         PREP    folder for the prepared scans and the CSV list (default runs/prep3d)
set -euo pipefail
SHARED=${SHARED:-../shared/data}
PREP=${PREP:-runs/prep3d}
mkdir -p "$PREP"
FIXED="$SHARED/neurite-oasis/OASIS_OAS1_0001_MR1/aligned_norm.nii.gz"

# 1. the LapIRN people into the neurite-oasis space (their headers say RAS at the corner; one
#    affine stage each onto OAS1_0001, so all training scans share one template space)
for s in A B; do
    out="$PREP/lapirn_${s}_in_oas1_0001.nii.gz"
    [ -f "$out" ] || hyperreg affine --moving "$SHARED/lapirn-3d/image_${s}_160x192x144.nii.gz" \
        --fixed "$FIXED" --moved "$out"
done

# 2. one CSV source: four people in one space; the LapIRN coarse label maps are not used
cat > "$PREP/people3d.csv" <<EOF
image,seg,subject
$(realpath "$SHARED")/neurite-oasis/OASIS_OAS1_0001_MR1/aligned_norm.nii.gz,$(realpath "$SHARED")/neurite-oasis/OASIS_OAS1_0001_MR1/aligned_seg35.nii.gz,OAS1_0001
$(realpath "$SHARED")/neurite-oasis/OASIS_OAS1_0002_MR1/aligned_norm.nii.gz,$(realpath "$SHARED")/neurite-oasis/OASIS_OAS1_0002_MR1/aligned_seg35.nii.gz,OAS1_0002
lapirn_A_in_oas1_0001.nii.gz,,lapirn_A
lapirn_B_in_oas1_0001.nii.gz,,lapirn_B
EOF

common=(--ndim 3 --data "$PREP/people3d.csv" --holdout OAS1_0002 --test-fraction 0 --spacing 2
        --batch-size 1 --checkpoint-every 250 --val-every 500 --device cpu)

# 3. phase 1 (as it happened): lr 1e-3, half synthetic pairs, seed 0; it diverged at step 1283
#    (benchmarks/RESULTS_hypernet.md), so only its step-1250 checkpoint is kept
if [ ! -f "$PREP/init_step1250_lr1e-3.pt" ]; then
    hyperreg train "${common[@]}" --synth 0.5 --lr 1e-3 --steps 1250 --seed 0 --out runs/bundled3d
    cp runs/bundled3d/model.pt "$PREP/init_step1250_lr1e-3.pt"
fi

# 4. phase 2: from that checkpoint at lr 1e-4, a fifth of the pairs synthetic, seed 1
resume=()
ls runs/bundled3d_b/checkpoint_*.pt > /dev/null 2>&1 && resume=(--resume runs/bundled3d_b)
hyperreg train "${common[@]}" --synth 0.2 --init "$PREP/init_step1250_lr1e-3.pt" --lr 1e-4 \
    --steps 8000 --seed 1 --out runs/bundled3d_b "${resume[@]}"

# 5. the bundled file: float16 weights of the best validation checkpoint
python -c "from hyperreg.pretrained import export_model; \
export_model('runs/bundled3d_b/best.pt', 'hyperreg/pretrained/hypermorph-3d.pt')"
