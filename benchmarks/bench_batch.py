"""Throughput of ``hyperreg batch``: pairs per second, 2D and 3D, end to end.

End to end means what a user's batch job does per pair: read moving, fixed and their label maps
(NIfTI .nii.gz), register at one λ, compute Dice and folding, write moved image, displacement and
moved label map atomically, and record the pair. Untrained default-width model (speed does not
depend on training), synthetic Gaussian-blob images written to a temporary folder, one process.

    python benchmarks/bench_batch.py --pairs 16 --sizes 160x192 96x112x128 --device cpu
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _common import log, shape, table


def _write_pairs(root: Path, shape: tuple[int, ...], count: int) -> Path:
    import nibabel as nib
    import numpy as np

    rng = np.random.default_rng(0)
    grid = np.meshgrid(*[np.arange(s, dtype=np.float32) for s in shape], indexing="ij")
    rows = ["moving,fixed,moving_seg,fixed_seg"]
    for index in range(count):
        names = []
        for role in ("moving", "fixed"):
            image = np.zeros(shape, np.float32)
            for _ in range(6):
                centre = rng.uniform(0.2, 0.8, len(shape)) * np.array(shape)
                dist = sum((g - c) ** 2 for g, c in zip(grid, centre))
                image += np.exp(-dist / (2 * (0.08 * min(shape)) ** 2))
            image_path = root / f"{role}{index}.nii.gz"
            seg_path = root / f"{role}{index}_seg.nii.gz"
            nib.save(nib.Nifti1Image(image, np.eye(4)), image_path)
            nib.save(nib.Nifti1Image((image > 0.5).astype(np.uint8), np.eye(4)), seg_path)
            names.append((image_path.name, seg_path.name))
        rows.append(f"{names[0][0]},{names[1][0]},{names[0][1]},{names[1][1]}")
    csv_path = root / "pairs.csv"
    csv_path.write_text("\n".join(rows) + "\n")
    return csv_path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["160x192", "96x112x128"])
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    import torch

    from hyperreg.apps.batch import run_batch
    from hyperreg.config import ModelConfig
    from hyperreg.method.model import HyperMorph, save_checkpoint

    rows = []
    for size in args.sizes:
        dims = shape(size)
        log(f"batch {size} ...")
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            torch.manual_seed(0)
            model = save_checkpoint(HyperMorph(ModelConfig(ndim=len(dims))), root / "model.pt")
            pairs = _write_pairs(root, dims, args.pairs)
            start = time.perf_counter()
            run_batch(model, pairs, root / "out", lam=0.3, device=args.device, init="none")
            seconds = time.perf_counter() - start
        rows.append([size, args.pairs, f"{seconds:.1f}", f"{args.pairs / seconds:.2f}"])
    print(
        "`hyperreg batch` end to end per pair: read moving, fixed and both label maps (.nii.gz), "
        "register at λ = 0.3, Dice and folding, write moved image, displacement and moved label "
        "map atomically, record the pair. One process, untrained default-width model, synthetic "
        f"blob images, device {args.device}. No target in DESIGN.md §5; reported for scale.\n"
    )
    print(table(["size", "pairs", "seconds", "pairs per second"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
