"""Pack what the 3D recipe needs on a GPU machine that has torch but no network: the recipe's
data at 2 mm and the wheels of hyperreg's dependencies that machine lacks.

The device machine gets the repository and at most 64 MiB with it per call, and ``../shared``
does not travel. The recipe (``scripts/train_hypermorph_3d.py``) resamples every scan to 2 mm
RAS before training, so its 1 mm sources are resampled to 2 mm here, once, onto the grid the
recipe would give them (:func:`hyperreg.geometry.resample.conformed_grid`; linear for images,
nearest neighbour for label maps; images and label maps keep their on-disk dtype), under the same
relative paths and names; a person's label map goes onto the 2 mm grid of their image (as the
recipe puts it there). The recipe then reads them as it reads ``../shared/data``.

Writes (both folders are git-ignored; ``scripts/device_3d.sh`` reads them)::

    .devpack/data/...      the recipe's sources at 2 mm (about 30 MB)
    .devpack/whl/*.whl     nibabel, isal, monai (for the device's Python; see --python-version)
    .devpack-sitk/*.whl    SimpleITK alone (about 53 MB: it travels in a call of its own)

Usage (here, where pip reaches the package registry)::

    python scripts/pack_3d_device.py                # for the device's Python 3.12
    python scripts/pack_3d_device.py --python-version 3.11 --out /tmp/pack --sitk-out /tmp/sitk

Env: ``HYPERREG_DATA`` the shared data folder (default ``../shared/data``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_hypermorph_3d import source_rows, synth_label_files  # the recipe's own files

SPACING = 2.0
WHEELS = ("nibabel", "isal", "monai")  # what hyperreg imports that the device image lacks
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def pack_file(source: Path, target: Path, label: bool, grid: object = None) -> object:
    """Write ``source`` at ``target`` resampled onto ``grid`` (a Volume), or onto its own 2 mm
    RAS grid (:func:`~hyperreg.geometry.resample.conformed_grid`, as the recipe resamples it)
    when ``grid`` is None; a file already at 2 mm or coarser and given no grid is copied as it
    is. Integer data keep their dtype (rounded), float data are written as float32. Returns
    the grid written (None for a copy), for the label map of the same person."""
    import nibabel as nib
    import numpy as np

    from hyperreg.geometry.io import load_volume
    from hyperreg.geometry.resample import conformed_grid, resample_to

    target.parent.mkdir(parents=True, exist_ok=True)
    image = nib.load(source)
    if grid is None and min(image.header.get_zooms()[:3]) >= SPACING - 1e-3:
        shutil.copyfile(source, target)
        return None
    volume = load_volume(source, label=label)
    moved = resample_to(volume, grid or conformed_grid(volume, SPACING, "RAS"), label=label)
    dtype = image.get_data_dtype()
    data = moved.data
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        data = np.clip(np.rint(data), info.min, info.max).astype(dtype)
    else:
        data = data.astype(np.float32)
    kind = nib.MGHImage if str(source).endswith(".mgz") else nib.Nifti1Image
    nib.save(kind(data, moved.affine), target)
    return moved


def download_wheels(names: tuple[str, ...], folder: Path, python: str) -> None:
    """``pip download`` the binary wheels of ``names`` (no dependencies) for ``python``."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    command += ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run([*command, "-d", str(folder), *names], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=".devpack", help="pack folder (default .devpack)")
    parser.add_argument("--sitk-out", default=".devpack-sitk", help="SimpleITK wheel folder")
    parser.add_argument("--python-version", default="3.12", help="the device's Python")
    parser.add_argument("--no-wheels", action="store_true", help="data only")
    args = parser.parse_args(argv)
    data = Path(os.environ.get("HYPERREG_DATA", "../shared/data")).resolve()
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    for items in source_rows(data).values():
        for image, seg, _ in items:  # a label map goes onto its image's 2 mm grid
            grid = pack_file(Path(image), out / "data" / Path(image).relative_to(data), False)
            if seg:
                target = out / "data" / Path(seg).relative_to(data)
                if grid is None:  # the image was copied: so is its label map
                    shutil.copyfile(seg, target)
                else:
                    pack_file(Path(seg), target, True, grid)
    for path in synth_label_files(data):
        pack_file(path, out / "data" / path.relative_to(data), True)
    if not args.no_wheels:
        download_wheels(WHEELS, out / "whl", args.python_version)
        download_wheels(("SimpleITK",), Path(args.sitk_out), args.python_version)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{out}: {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
