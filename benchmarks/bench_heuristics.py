"""The content checks run before every registration, on every input the project has.

``hyperreg.geometry.inspect`` says whether an input is a label map (``looks_like_label_map``)
and whether an image is a skull-stripped brain or a head (``skull_stripped`` /
``skull_evidence``); ``check_pair_contents`` warns when a pair mixes them. A wrong verdict is a
false alarm the user learns to ignore, so this script runs both checks on every 2D and 3D input
of the shared data folder (each with a known truth) and on copies made here the way users'
files differ: resampled to 1.5 and 3 mm, re-stored in another axis order with the matching
affine, with a header whose voxel size is halved or doubled (the array unchanged), thick-slice
(1 x 1 x 6 mm: slices averaged), brain-masked heads (a head multiplied by its label map's brain
mask dilated by 3 or 6 mm, like FreeSurfer's ``brainmask.mgz`` that keeps some tissue outside
the brain) and 2D slices along each axis. Table: one row per input, the
truth, the verdicts and whether a verdict is wrong (a false alarm), is None (nothing said) or
right; then the time of each check on a 256³ volume.

Usage: ``python benchmarks/bench_heuristics.py [--data DIR] [--quick]`` (stdout: the Markdown
section, progress on stderr). ``--quick`` keeps one input of each kind (the set
``tests/test_inspect.py`` runs).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_ROOT, log, table

from hyperreg.geometry.inspect import SkullEvidence, looks_like_label_map, skull_evidence
from hyperreg.geometry.inspect import skull_stripped
from hyperreg.geometry.io import Volume, load_volume
from hyperreg.geometry.resample import isotropic_grid, resample_to

HEAD, STRIPPED = "head", "stripped"


@dataclass(frozen=True)
class Case:
    """One input with its truth: ``truth`` is "label" (a label map), "head" or "stripped";
    ``true_header``: False for a copy whose header gives a wrong voxel size."""

    name: str
    truth: str
    make: Callable[[], Volume]
    true_header: bool = True


# --- derived copies ---------------------------------------------------------------------------


def resampled(volume: Volume, spacing: float, label: bool) -> Volume:
    """``volume`` on a grid of isotropic ``spacing`` mm voxels (linear; labels: nearest)."""
    grid = isotropic_grid(volume, spacing)
    return volume if grid is None else resample_to(volume, grid, label=label)


def mislabelled(volume: Volume, factor: float) -> Volume:
    """The same array with a header whose voxels are ``factor`` times their true size (a 2 mm
    scan saved as 1 mm, or the reverse): sizes in mm are then wrong by ``factor`` per axis."""
    affine = volume.affine.copy()
    affine[:3, :3] *= factor
    return Volume(volume.data, affine, volume.disk_shape, path=volume.path)


def restored(volume: Volume) -> Volume:
    """The same anatomy stored in another axis order: axes reversed and the first flipped, the
    affine changed to match (world positions unchanged)."""
    ndim = volume.ndim
    order = tuple(reversed(range(ndim)))
    data = np.flip(np.transpose(volume.data, order), axis=0)
    affine = volume.affine.copy()
    columns = [affine[:3, axis].copy() for axis in order]
    for axis, column in enumerate(columns):
        affine[:3, axis] = column
    shape = data.shape
    affine[:3, 3] = affine[:3, 3] + affine[:3, 0] * (shape[0] - 1)
    affine[:3, 0] = -affine[:3, 0]
    return Volume(np.ascontiguousarray(data), affine, shape, path=volume.path)


def thick(volume: Volume, millimetres: float, label: bool) -> Volume:
    """Thick slices along the last axis: ``millimetres / spacing`` neighbouring slices averaged
    (labels: every such slice kept), the affine's last column scaled to match."""
    factor = max(2, round(millimetres / volume.spacing[-1]))
    count = volume.data.shape[-1] // factor
    data = volume.data[..., : count * factor]
    if label:
        data = data[..., factor // 2 :: factor]
    else:
        data = data.reshape(*data.shape[:-1], count, factor).mean(-1, dtype=np.float32)
    affine = volume.affine.copy()
    affine[:3, 3] += affine[:3, 2] * (factor - 1) / 2
    affine[:3, 2] *= factor
    return Volume(np.ascontiguousarray(data), affine, data.shape, path=volume.path)


def masked(head: Volume, labels: Volume, millimetres: float) -> Volume:
    """A brainmask-like image: ``head`` times its brain mask (``labels > 0``) dilated by
    ``millimetres`` (face steps, rounded to voxels), which keeps a rim of non-brain tissue."""
    mask = labels.data > 0
    steps = max(1, round(millimetres / min(head.spacing)))
    for _ in range(steps):
        grown = mask.copy()
        for axis in range(mask.ndim):
            grown[(slice(None),) * axis + (slice(1, None),)] |= mask[
                (slice(None),) * axis + (slice(None, -1),)
            ]
            grown[(slice(None),) * axis + (slice(None, -1),)] |= mask[
                (slice(None),) * axis + (slice(1, None),)
            ]
        mask = grown
    return Volume(head.data * mask, head.affine, head.disk_shape, path=head.path)


def middle_slice(volume: Volume, axis: int, offset: float = 0.0) -> Volume:
    """2D slice of a 3D volume across array ``axis``, at the middle (plus ``offset`` of the
    length), with the matching 4x4 affine (the cut axis becomes the third column)."""
    index = round((0.5 + offset) * (volume.data.shape[axis] - 1))
    data = np.take(volume.data, index, axis=axis)
    keep = [a for a in range(3) if a != axis]
    affine = np.eye(4)
    affine[:3, 0] = volume.affine[:3, keep[0]]
    affine[:3, 1] = volume.affine[:3, keep[1]]
    affine[:3, 2] = volume.affine[:3, axis]
    affine[:3, 3] = volume.affine[:3, 3] + volume.affine[:3, axis] * index
    return Volume(np.ascontiguousarray(data), affine, data.shape, path=volume.path)


# --- the catalogue ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)  # a file and its copies come one after another
def _read(path: Path, label: bool) -> Volume:
    if path.suffix == ".npz":
        return load_volume(path, label=label, assume_identity=True)
    if path.suffix == ".jpg":
        from PIL import Image

        data = np.asarray(Image.open(path), dtype=np.float32)
        return Volume(data, np.eye(4), data.shape, path=path)  # no header: 1 mm pixels
    return load_volume(path, label=label)


def _loader(path: Path, label: bool = False) -> Callable[[], Volume]:
    return lambda: _read(path, label)


def _derived(name: str, truth: str, make: Callable[[], Volume]) -> Iterator[Case]:
    """The copies of one 3D input: resampled, re-stored, thick-slice, 2D slices."""
    label = truth == "label"
    for spacing in (1.5, 3.0):
        yield Case(
            f"{name} resampled {spacing:g} mm", truth, lambda s=spacing: resampled(make(), s, label)
        )
    yield Case(f"{name} re-stored", truth, lambda: restored(make()))
    for factor in (0.5, 2.0):
        yield Case(
            f"{name} header voxels x{factor:g}",
            truth,
            lambda f=factor: mislabelled(make(), f),
            true_header=False,
        )
    yield Case(f"{name} thick 6 mm", truth, lambda: thick(make(), 6.0, label))
    for axis in range(3):
        yield Case(f"{name} slice axis {axis}", truth, lambda a=axis: middle_slice(make(), a))
    yield Case(f"{name} slice axis 0 +20%", truth, lambda: middle_slice(make(), 0, 0.2))
    yield Case(f"{name} slice axis 1 -20%", truth, lambda: middle_slice(make(), 1, -0.2))


def catalogue(data: Path, quick: bool = False) -> list[Case]:
    """Every input (with its truth) under ``data`` that exists, and the derived copies."""
    cases: list[Case] = []

    def add(relative: str, truth: str, derive: bool = True, label: bool = False) -> None:
        path = data / relative
        if not path.exists():
            return
        make = _loader(path, label)
        cases.append(Case(relative, truth, make))
        if derive:
            cases.extend(_derived(relative, truth, make))

    oasis = "neurite-oasis/OASIS_OAS1_000{}_MR1"
    for person in (1, 2):
        root = oasis.format(person)
        add(f"{root}/aligned_norm.nii.gz", STRIPPED, derive=person == 1 or not quick)
        for name in ("aligned_seg35", "aligned_seg4"):
            add(f"{root}/{name}.nii.gz", "label", derive=person == 1 and not quick, label=True)
        add(f"{root}/slice_norm.nii.gz", STRIPPED, derive=False)
        add(f"{root}/slice_orig.nii.gz", HEAD, derive=False)
        for name in ("slice_seg4", "slice_seg24"):
            add(f"{root}/{name}.nii.gz", "label", derive=False, label=True)
        free = f"oasis1-freesurfer/OAS1_000{person}_MR1"
        add(f"{free}/norm.mgz", STRIPPED, derive=person == 1 or not quick)
        add(f"{free}/aseg.mgz", "label", derive=person == 1 and not quick, label=True)
    add("learn2reg-tutorials2019/subject_1_vol.npz", STRIPPED, derive=not quick)
    add("learn2reg-tutorials2019/subject_1_seg.npz", "label", derive=False, label=True)
    for name in ("image_A_160x192x144", "image_B_160x192x144"):
        add(f"lapirn-3d/{name}.nii.gz", STRIPPED, derive=not quick)
        add(f"lapirn-3d/{name}_seg.nii.gz", "label", derive=False, label=True)
    add("misc-3d/freesurferformats_brain.mgz", STRIPPED, derive=not quick)
    add("misc-3d/pycortex_S1_T1.nii.gz", HEAD)
    add("misc-3d/studyforrest_sub02_T1w.nii.gz", HEAD, derive=not quick)
    add("misc-3d/fernando_gif_labels.nii.gz", "label", derive=not quick, label=True)
    heads = sorted((data / "ixi-2mm").glob("*_T1.nii.gz"))
    for number, path in enumerate(heads[:3] if quick else heads):
        person = path.name.removesuffix("_T1.nii.gz")
        add(f"ixi-2mm/{path.name}", HEAD, derive=number < (1 if quick else 5))
        seg = data / "ixi-2mm" / f"{person}_DLMUSE.nii.gz"
        if not seg.exists():
            continue
        add(f"ixi-2mm/{seg.name}", "label", derive=number == 0 and not quick, label=True)
        if number < (1 if quick else 5):
            for mm in (3.0, 6.0):
                name = f"ixi-2mm/{person} T1 x brain mask dilated {mm:g} mm"

                def make(t1: Path = path, seg: Path = seg, mm: float = mm) -> Volume:
                    return masked(load_volume(t1), load_volume(seg, label=True), mm)

                cases.append(Case(name, STRIPPED, make))
                if mm == 3.0:
                    cases.extend(_derived(name, STRIPPED, make))
    maps = sorted((data / "synthseg-labelmaps").glob("*/*.nii.gz"))
    for path in maps[:2] if quick else maps:
        add(f"synthseg-labelmaps/{path.parent.name}/{path.name}", "label", derive=False, label=True)
    people = sorted((data / "mindboggle-trt20-2d").glob("OASIS-TRT-20-*"))
    for folder in people[:2] if quick else people:
        for path in sorted(folder.glob("*.nii.gz")):
            truth = "label" if "labels" in path.name else STRIPPED
            add(f"{folder.parent.name}/{folder.name}/{path.name}", truth, False, truth == "label")
    subjects = sorted((data / "multicontrast-2d").glob("S*"))
    for folder in subjects[:2] if quick else subjects:
        for path in sorted(folder.glob("*.nii.gz")):
            add(f"multicontrast-2d/{folder.name}/{path.name}", HEAD, derive=False)
    for path in sorted((data / "antspy").glob("*.jpg"))[: 1 if quick else None]:
        add(f"antspy/{path.name}", STRIPPED, derive=False)
    spec = importlib.util.find_spec("nilearn")
    if spec is not None and spec.submodule_search_locations:
        mni = Path(spec.submodule_search_locations[0]) / "datasets" / "data"
        path = mni / "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz"
        if path.exists() and not quick:
            cases.append(Case("nilearn MNI152 2009a T1", STRIPPED, _loader(path)))
            cases.extend(_derived("nilearn MNI152 2009a T1", STRIPPED, _loader(path)))
    return cases


# --- verdicts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What the checks said about one case."""

    label_map: bool
    stripped: bool | None  # None: cannot tell (or a label map: not asked)
    evidence: SkullEvidence | None
    same_neighbours: float | None  # of an integer-valued array, as looks_like_label_map counts

    def wrong(self, truth: str) -> list[str]:
        """The false alarms: a label-map verdict on an image, a skull verdict against truth."""
        out = []
        if self.label_map and truth != "label":
            out.append("image called a label map")
        if truth in (HEAD, STRIPPED) and self.stripped is not None:
            if self.stripped != (truth == STRIPPED):
                out.append(f"{truth} called {'stripped' if self.stripped else 'head'}")
        return out


def same_neighbours(data: np.ndarray) -> float | None:
    """Share of neighbouring voxel pairs (not both the most common value, along each axis, on
    every second voxel beyond 2²² voxels) holding the same value; None unless ``data`` is
    integer-valued."""
    if data.size > 1 << 22:
        data = data[(slice(None, None, 2),) * data.ndim]
    if not np.all(np.isfinite(data)) or np.max(np.abs(data - np.rint(data))) > 1e-3:
        return None
    values, counts = np.unique(np.rint(data), return_counts=True)
    background = values[np.argmax(counts)]
    equal = total = 0
    for axis in range(data.ndim):
        first, second = np.swapaxes(data, 0, axis)[1:], np.swapaxes(data, 0, axis)[:-1]
        counted = (first != background) | (second != background)
        equal += int(np.count_nonzero((first == second) & counted))
        total += int(np.count_nonzero(counted))
    return equal / total if total else None


def judge(volume: Volume) -> Verdict:
    """Run the checks the way ``check_pair_contents`` does."""
    label_map = looks_like_label_map(volume)
    evidence = None if label_map else skull_evidence(volume)
    stripped = None if evidence is None else evidence.stripped
    return Verdict(label_map, stripped, evidence, same_neighbours(volume.data))


def _word(verdict: Verdict, truth: str) -> str:
    if verdict.wrong(truth):
        return "WRONG: " + "; ".join(verdict.wrong(truth))
    if truth == "label":
        return "right" if verdict.label_map else "missed (not called a label map)"
    return "right" if verdict.stripped is not None else "nothing said"


def run(cases: Sequence[Case]) -> list[tuple[Case, Verdict, Volume]]:
    """Judge every case; log progress to stderr."""
    out = []
    for number, case in enumerate(cases):
        volume = case.make()
        out.append((case, judge(volume), volume.spatial_shape))
        log(f"[{number + 1}/{len(cases)}] {case.name}: {out[-1][1]}")
    return out


def _timing(volume: Volume, repeats: int = 3) -> tuple[float, float]:
    times = {}
    for name, fn in (("label", looks_like_label_map), ("skull", skull_stripped)):
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            fn(volume)
            best = min(best, time.perf_counter() - start)
        times[name] = best
    return times["label"], times["skull"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="shared data folder")
    parser.add_argument("--quick", action="store_true", help="one input of each kind")
    args = parser.parse_args(argv)
    cases = catalogue(args.data, quick=args.quick)
    if not cases:
        log(f"no inputs found under {args.data}")
        return 1
    results = run(cases)
    rows = []
    for case, verdict, shape in results:
        said = "label map" if verdict.label_map else "image"
        if verdict.same_neighbours is not None:
            said += f" ({verdict.same_neighbours:.2f})"
        skull = {None: "-", True: "stripped", False: "head"}[verdict.stripped]
        found = verdict.evidence
        shell = size = zero = "-"
        if found is not None:
            shell, size = f"{found.bright_shell:.3f}", f"{found.size:.0f}"
            zero = "-" if found.zero_background is None else f"{found.zero_background:.2f}"
        rows.append(
            [case.name, "x".join(map(str, shape)), case.truth, said, skull, shell, size, zero]
            + [_word(verdict, case.truth)]
        )
    wrong = sum(bool(v.wrong(c.truth)) for c, v, _ in results)
    images = [(c, v) for c, v, _ in results if c.truth != "label"]
    told = sum(v.stripped is not None for _, v in images)
    labels = [(c, v) for c, v, _ in results if c.truth == "label"]
    label_share = [v.same_neighbours for _, v in labels if v.same_neighbours is not None]
    image_share = [v.same_neighbours for _, v in images if v.same_neighbours is not None]
    print(
        f"{len(results)} inputs ({len(images)} images, {len(labels)} label maps): "
        f"{wrong} false alarms; skull state told for {told} of {len(images)} images "
        f"(nothing said for the others); {sum(v.label_map for _, v in labels)} of "
        f"{len(labels)} label maps recognised.\n"
    )
    if label_share and image_share:
        print(
            f"Same-value neighbours (label check, threshold 0.35): label maps "
            f"{min(label_share):.3f}-{max(label_share):.3f}; the {len(image_share)} "
            f"integer-valued images {min(image_share):.3f}-{max(image_share):.3f}.\n"
        )
    ranges = []
    for ndim in (3, 2):
        for truth in (STRIPPED, HEAD):
            found = [
                v.evidence
                for c, v, shape in results
                if c.truth == truth
                and len(shape) == ndim
                and v.evidence is not None
                and c.true_header
            ]
            if not found:
                continue
            zeros = [e.zero_background for e in found if e.zero_background is not None]
            cells = [f"{ndim}D {truth}", len(found)]
            for values, digits in (
                ([e.size for e in found], 0),
                ([e.bright_shell for e in found], 3),
                (zeros, 2),
            ):
                cells.append(
                    f"{min(values):.{digits}f}-{max(values):.{digits}f}" if values else "-"
                )
            ranges.append(cells)
    print(
        "Range of each skull measure by truth (every image with a measure, except the copies "
        "with a wrong voxel size in their header):\n"
    )
    print(table(["images", "count", "size (ml / cm²)", "bright shell", "zero background"], ranges))
    print()
    header = ["input", "shape", "truth", "label check (same neighbours)", "skull check"]
    header += ["bright shell"]
    header += ["size (ml / cm²)", "zero background", "verdict"]
    print(table(header, rows))
    timed = ("oasis1-freesurfer/OAS1_0001_MR1/norm.mgz", "oasis1-freesurfer/OAS1_0001_MR1/aseg.mgz")
    timed += ("misc-3d/pycortex_S1_T1.nii.gz",)
    print()
    for name in timed:
        if (args.data / name).exists():
            label_s, skull_s = _timing(load_volume(args.data / name))
            print(
                f"- Time on `{name}` (256³, best of 3, one thread, a shared machine): "
                f"looks_like_label_map {label_s:.3f} s, skull_stripped {skull_s:.3f} s."
            )
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
