"""Clinical-scan cases for benchmarks/RESULTS_clinical.md: a held-out IXI scan with metal-like
voxels, or with a strong bias field, written to a work folder (never into the repository).

``outlier``: a 3 x 3 x 3 block of 27 voxels at 50 times the image maximum, placed 3 voxels
inside the most superior head voxel (the scalp at the top of the head; head = above 10 % of
the maximum), as metal or an electrode leaves. ``bias``: the scan times a smooth multiplicative
field ``exp(0.35 x + 0.25 y - 0.2 z + 0.2 y^2)`` over array coordinates scaled to [-1, 1],
normalised to a mean log of 0 (about 0.5x to 2.5x across the volume). ``cut``: the array
cropped to the lowest 62 % of the head's superior-inferior extent (a smaller array, its affine
moved with it, as a partial field of view is stored), with its DLMUSE map cropped alike.
``cavity``: a 16 mm sphere set to 0 inside the brain (centred 25 mm to the right of the head's
centre of mass, 10 mm above it), with ``<name>_cavity_keep.nii.gz`` (0 in the sphere, 1
elsewhere: the ``--moving-mask``) and ``<name>_cavity_sphere.nii.gz`` (label 1 in the sphere:
warped with ``--moving-seg`` it gives the cavity's volume after registration).

Usage: ``python benchmarks/clinical_cases.py --out runs/clinical IXI012-HH-1211 IXI239-HH-2296``
writes ``<out>/<name>_outlier.nii.gz`` and ``<out>/<name>_bias.nii.gz`` for each scan of
``--data`` (default: the ixi-2mm folder of ../shared/data); the registrations are plain
``hyperreg register`` commands (RESULTS_clinical.md lists them).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import nibabel as nib
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_ROOT

OUTLIER_FACTOR = 50.0
CUT_SHARE = 0.62
CAVITY_MM = 16.0


def with_outliers(image: nib.Nifti1Image) -> tuple[np.ndarray, tuple[int, ...]]:
    """The image's data with the 27-voxel block at 50x its maximum, and the block's centre."""
    data = np.asarray(image.dataobj, dtype=np.float32)
    head = np.argwhere(data > 0.1 * data.max())
    world = head @ image.affine[:3, :3].T + image.affine[:3, 3]
    top = head[np.argmax(world[:, 2])]  # the most superior head voxel
    down = np.linalg.inv(image.affine[:3, :3]) @ np.array([0.0, 0.0, -1.0])
    centre = np.round(top + 3 * down / np.abs(down).max()).astype(int)
    block = tuple(slice(int(c) - 1, int(c) + 2) for c in centre)
    out = data.copy()
    out[block] = OUTLIER_FACTOR * data.max()
    return out, tuple(int(c) for c in centre)


def with_bias(image: nib.Nifti1Image) -> np.ndarray:
    """The image's data times the smooth field of the module docstring."""
    data = np.asarray(image.dataobj, dtype=np.float32)
    x, y, z = np.meshgrid(*[np.linspace(-1, 1, s) for s in data.shape], indexing="ij")
    log_field = 0.35 * x + 0.25 * y - 0.2 * z + 0.2 * y**2
    return (data * np.exp(log_field - log_field.mean())).astype(np.float32)


def cut_lower(image: nib.Nifti1Image, share: float = CUT_SHARE) -> tuple[slice, ...]:
    """Array slices keeping the lowest ``share`` of the head's superior-inferior extent (head
    = above 10 % of the maximum; the array axis closest to superior)."""
    data = np.asarray(image.dataobj, dtype=np.float32)
    axis = int(np.argmax(np.abs(image.affine[2, :3])))
    up = image.affine[2, axis] > 0
    head = np.argwhere(data > 0.1 * data.max())[:, axis]
    low, high = int(head.min()), int(head.max())
    keep = round(share * (high - low + 1))
    cut = slice(low, low + keep) if up else slice(high + 1 - keep, high + 1)
    index = [slice(None)] * 3
    # keep the inferior part and everything below it in the array
    index[axis] = slice(0, cut.stop) if up else slice(cut.start, data.shape[axis])
    return tuple(index)


def cropped(image: nib.Nifti1Image, index: tuple[slice, ...], dtype=np.float32) -> nib.Nifti1Image:
    """``image`` cropped to ``index`` with its affine moved to the new first voxel."""
    data = np.asarray(image.dataobj)[index].astype(dtype)
    start = np.array([s.start or 0 for s in index] + [1.0])
    affine = image.affine.copy()
    affine[:, 3] = image.affine @ start
    header = image.header.copy()
    header.set_data_dtype(dtype)
    return nib.Nifti1Image(data, affine, header)


def with_cavity(image: nib.Nifti1Image) -> tuple[np.ndarray, np.ndarray]:
    """The image's data with a 16 mm sphere at 0, and the sphere (bool)."""
    data = np.asarray(image.dataobj, dtype=np.float32)
    head = np.argwhere(data > 0.1 * data.max())
    centre_world = head.mean(0) @ image.affine[:3, :3].T + image.affine[:3, 3]
    centre_world += np.array([25.0, 0.0, 10.0])  # RAS: right and up
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in data.shape], indexing="ij"), -1)
    world = grid @ image.affine[:3, :3].T + image.affine[:3, 3]
    sphere = np.linalg.norm(world - centre_world, axis=-1) <= CAVITY_MM / 2
    out = data.copy()
    out[sphere] = 0.0
    return out, sphere


def write_cut_and_cavity(data_dir: Path, out_dir: Path, name: str) -> None:
    """``<name>_cut.nii.gz`` with ``<name>_cut_DLMUSE.nii.gz``, and the cavity files."""
    image = nib.load(data_dir / f"{name}_T1.nii.gz")
    index = cut_lower(image)
    nib.save(cropped(image, index), out_dir / f"{name}_cut.nii.gz")
    labels = nib.load(data_dir / f"{name}_DLMUSE.nii.gz")
    nib.save(cropped(labels, index, np.int32), out_dir / f"{name}_cut_DLMUSE.nii.gz")
    data, sphere = with_cavity(image)
    header = image.header.copy()
    header.set_data_dtype(np.float32)
    nib.save(nib.Nifti1Image(data, image.affine, header), out_dir / f"{name}_cavity.nii.gz")
    for kind, values in (("keep", ~sphere), ("sphere", sphere)):
        mask = nib.Nifti1Image(values.astype(np.uint8), image.affine)
        nib.save(mask, out_dir / f"{name}_cavity_{kind}.nii.gz")
    print(
        f"{name}: cut to {data.shape} -> {nib.load(out_dir / f'{name}_cut.nii.gz').shape}; "
        f"cavity of {int(sphere.sum())} voxels"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help="scan names, e.g. IXI012-HH-1211")
    parser.add_argument("--data", type=Path, default=DATA_ROOT / "ixi-2mm")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--n4",
        action="store_true",
        help="also time hyperreg's N4 (correct_bias) on each scan and its biased copy, and say "
        "how much of the synthetic field it removes",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        image = nib.load(args.data / f"{name}_T1.nii.gz")
        spoiled, centre = with_outliers(image)
        # float32: the scan's own data type (uint8 with a scale for ixi-2mm) would quantise
        # the spoiled scan's head to a few grey levels
        header = image.header.copy()
        header.set_data_dtype(np.float32)
        for kind, data in (("outlier", spoiled), ("bias", with_bias(image))):
            out = nib.Nifti1Image(data, image.affine, header)
            nib.save(out, args.out / f"{name}_{kind}.nii.gz")
        print(f"{name}: 27 voxels at {OUTLIER_FACTOR:g}x the maximum around voxel {centre}; bias")
        write_cut_and_cavity(args.data, args.out, name)
        if args.n4:
            n4_report(args.data / f"{name}_T1.nii.gz", args.out / f"{name}_bias.nii.gz")
    return 0


def n4_report(clean_path: Path, biased_path: Path) -> None:
    """Seconds of :func:`hyperreg.geometry.bias.correct_bias` on a scan and its biased copy,
    and the spread over the head of log(biased / clean) before and after correcting both (N4
    also removes the scan's own bias, so the corrected copies are compared with each other)."""
    import time

    from hyperreg.geometry.bias import correct_bias
    from hyperreg.geometry.io import load_volume

    corrected = {}
    for kind, path in (("clean", clean_path), ("biased", biased_path)):
        volume = load_volume(path)
        tic = time.perf_counter()
        corrected[kind] = (volume.data, correct_bias(volume).data)
        print(f"  N4 on {path.name}: {time.perf_counter() - tic:.1f} s")
    clean, biased = corrected["clean"], corrected["biased"]
    head = clean[0] > 0.1 * clean[0].max()

    def spread(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.std(np.log(np.maximum(a[head], 1e-3) / np.maximum(b[head], 1e-3))))

    print(
        f"  std of log(biased / clean) over the head: {spread(biased[0], clean[0]):.3f} as "
        f"written, {spread(biased[1], clean[1]):.3f} after N4 on both"
    )


if __name__ == "__main__":
    raise SystemExit(main())
