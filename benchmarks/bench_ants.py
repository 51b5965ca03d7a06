"""Classical anchor: ANTs SyN (and SyNCC) through ANTsPy beside hyperreg at λ*.

On the shared 2D OASIS pair (moving OAS1_0002 → fixed OAS1_0001, 160×192 slices, 24-label
segmentation): mean Dice over the non-zero labels present in both label maps (one list for
every method, scored with ``hyperreg.metrics.mean_dice``), folding (% of pixels with Jacobian
determinant ≤ 0, ``hyperreg.metrics.folding_fraction``) and wall time, one registration per
method, plus the unregistered pair.

ANTs images are built from numpy with spacing 1 and identity direction, so ANTs' physical
units are pixels. Folding for ANTs is computed from its forward warp field (the deformable
stage); the affine stage is reported by the sign of its determinant (the composite folds where
the warp does when that sign is positive). Wall time for ANTs is the ``ants.registration`` call;
for hyperreg it is ``register_pair`` (normalisation, forward pass at λ, warps, metrics) after one
warm-up call, median of ``--repeats``.

    python benchmarks/bench_ants.py --model /tmp/bench_model/model.pt --lambda 0.5

Benchmark-only dependency: ``pip install -e .[bench]`` (antspyx). ANTs is only called here.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

DATA = Path("/work/shared/data/neurite-oasis")
MOVING = "OASIS_OAS1_0002_MR1"
FIXED = "OASIS_OAS1_0001_MR1"


def _load2d(path: Path):
    import nibabel as nib
    import numpy as np

    arr = np.asarray(nib.load(str(path)).dataobj)
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    return arr


def _folding_pct(disp_np) -> float:
    """``disp_np``: ``(N, *S)`` displacement in pixels, axis order of the arrays."""
    import torch

    from hyperreg.metrics import folding_fraction

    return 100.0 * folding_fraction(torch.from_numpy(disp_np.astype("float32"))[None])


def run_ants(kind: str, fixed, moving, fixed_seg, moving_seg, labels, seed: int) -> dict:
    import ants
    import numpy as np

    from hyperreg.metrics import mean_dice

    f_img = ants.from_numpy(fixed.astype("float32"))
    m_img = ants.from_numpy(moving.astype("float32"))
    m_seg = ants.from_numpy(moving_seg.astype("float32"))
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        reg = ants.registration(
            fixed=f_img,
            moving=m_img,
            type_of_transform=kind,
            outprefix=os.path.join(tmp, "r_"),
            random_seed=seed,
        )
        seconds = time.perf_counter() - start
        moved_seg = ants.apply_transforms(
            fixed=f_img,
            moving=m_seg,
            transformlist=reg["fwdtransforms"],
            interpolator="genericLabel",
        ).numpy()
        dice = mean_dice(np.rint(moved_seg).astype("int32"), fixed_seg, labels)
        folding, affine_note = "n/a", ""
        warps = [t for t in reg["fwdtransforms"] if t.endswith((".nii.gz", ".nii"))]
        if warps:
            field = ants.image_read(warps[0]).numpy()  # (*S, N), physical = pixels
            folding = f"{_folding_pct(np.moveaxis(field, -1, 0)):.3f}"
        mats = [t for t in reg["fwdtransforms"] if t.endswith(".mat")]
        if mats:
            tx = ants.read_transform(mats[0])
            n = fixed.ndim
            det = float(np.linalg.det(np.asarray(tx.parameters[: n * n]).reshape(n, n)))
            affine_note = f"affine det {det:.3f}"
    return {"dice": dice, "folding": folding, "seconds": seconds, "note": affine_note}


def run_hyperreg(model_path: str, lam: float, repeats: int, labels) -> dict:
    from hyperreg.inference import register_pair
    from hyperreg.io import load_volume
    from hyperreg.metrics import mean_dice
    from hyperreg.model import load_checkpoint

    model, _ = load_checkpoint(model_path)
    mov = load_volume(DATA / MOVING / "slice_norm.nii.gz")
    fix = load_volume(DATA / FIXED / "slice_norm.nii.gz")
    mseg = load_volume(DATA / MOVING / "slice_seg24.nii.gz", label=True)
    fseg = load_volume(DATA / FIXED / "slice_seg24.nii.gz", label=True)

    def call():
        return register_pair(model, mov, fix, lam, moving_seg=mseg, fixed_seg=fseg)

    call()
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    dice = mean_dice(result.moved_seg, fseg.data, labels)
    return {
        "dice": dice,
        "folding": f"{100.0 * result.folding_fraction:.3f}",
        "seconds": statistics.median(times),
        "note": f"λ = {lam}, median of {repeats}",
    }


def _train_default(out: str) -> str:
    cmd = ["hyperreg", "train", "--data", str(DATA), "--ndim", "2", "--steps", "1500"]
    cmd += ["--out", out]
    print("no --model given; training one:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return str(Path(out) / "model.pt")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="hyperreg 2D checkpoint (default: train one)")
    parser.add_argument("--lambda", dest="lam", type=float, default=0.5)
    parser.add_argument("--methods", nargs="+", default=["SyN", "SyNCC"])
    parser.add_argument("--repeats", type=int, default=5, help="timed hyperreg calls")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    import ants
    import numpy as np
    import torch

    import hyperreg
    from hyperreg.metrics import mean_dice

    model_path = args.model or _train_default("/tmp/bench_model")
    fixed = _load2d(DATA / FIXED / "slice_norm.nii.gz").astype("float32")
    moving = _load2d(DATA / MOVING / "slice_norm.nii.gz").astype("float32")
    fixed_seg = np.rint(_load2d(DATA / FIXED / "slice_seg24.nii.gz")).astype("int32")
    moving_seg = np.rint(_load2d(DATA / MOVING / "slice_seg24.nii.gz")).astype("int32")
    labels = sorted(
        int(v) for v in set(np.unique(fixed_seg)) & set(np.unique(moving_seg)) if v != 0
    )

    print(
        f"hyperreg {hyperreg.__version__}, antspyx {ants.__version__}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), ITK threads "
        f"{os.environ.get('ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS', 'default')}, "
        f"python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    print(f"pair: {MOVING} → {FIXED}, 2D {fixed.shape}, {len(labels)} labels scored: {labels}")
    print(f"model: {model_path}")
    print()
    print("| method | mean Dice | folding (% Jdet ≤ 0) | wall time (s) | note |")
    print("|---|---|---|---|---|")
    print(f"| no registration | {mean_dice(moving_seg, fixed_seg, labels):.3f} | 0 | 0 | |")
    rows = {}
    for kind in args.methods:
        try:
            r = run_ants(kind, fixed, moving, fixed_seg, moving_seg, labels, args.seed)
        except Exception as err:
            print(f"| ANTs {kind} | failed: {type(err).__name__}: {err} | | | |")
            continue
        rows[kind] = r
        print(
            f"| ANTs {kind} | {r['dice']:.3f} | {r['folding']} | {r['seconds']:.2f} | "
            f"{r['note']} |",
            flush=True,
        )
    h = run_hyperreg(model_path, args.lam, args.repeats, labels)
    print(f"| hyperreg | {h['dice']:.3f} | {h['folding']} | {h['seconds']:.3f} | {h['note']} |")
    if "SyN" in rows:
        verdict = "met" if h["dice"] > rows["SyN"]["dice"] else "MISSED"
        print()
        print(
            f"Target (DESIGN §5): Dice at λ* above ANTs SyN on the same pair: "
            f"{h['dice']:.3f} vs {rows['SyN']['dice']:.3f}, {verdict}."
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
