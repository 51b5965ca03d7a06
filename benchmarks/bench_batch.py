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

    from hyperreg.batch import run_batch
    from hyperreg.config import ModelConfig
    from hyperreg.model import HyperMorph, save_checkpoint

    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}")
    print("| size | pairs | seconds | pairs per second |")
    print("|---|---|---|---|")
    for size in args.sizes:
        shape = tuple(int(s) for s in size.split("x"))
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            torch.manual_seed(0)
            model = save_checkpoint(HyperMorph(ModelConfig(ndim=len(shape))), root / "model.pt")
            pairs = _write_pairs(root, shape, args.pairs)
            start = time.perf_counter()
            run_batch(model, pairs, root / "out", lam=0.3, device=args.device)
            seconds = time.perf_counter() - start
        print(f"| {size} | {args.pairs} | {seconds:.1f} | {args.pairs / seconds:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
