"""Input checks (hyperreg.geometry.inspect): label map or image, skull or not, voxel size.

The label-map and skull checks are heuristics; ``benchmarks/bench_heuristics.py`` runs them on
every shared input with its truth and on copies made the way users' files differ (the table:
``benchmarks/RESULTS_heuristics.md``). :func:`test_no_false_alarm_on_shared_inputs` runs the
same catalogue at its ``--quick`` size (one input of each kind): no verdict may be wrong, and
clear 3D cases (a head or a stripped brain at 1-2 mm) must be told.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from hyperreg.geometry.inspect import (
    check_pair_contents,
    label_grid_warning,
    looks_like_label_map,
    skull_evidence,
    skull_stripped,
    spacing_warning,
)
from hyperreg.geometry.io import Volume, load_volume
from shared_paths import DATA, REPO, data_path, needs_data

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_heuristics  # the catalogue of inputs with their truth

OASIS1 = "neurite-oasis/OASIS_OAS1_0001_MR1"
OASIS2 = "neurite-oasis/OASIS_OAS1_0002_MR1"
IXI = ("IXI012-HH-1211", "IXI162-HH-1548", "IXI174-HH-1571")


def _load(relative: str, **kw: object) -> Volume:
    return load_volume(DATA / relative, **kw)  # type: ignore[arg-type]


def _volume(data: np.ndarray, spacing: tuple[float, ...] = (1.0, 1.0, 1.0), name: str = "x"):
    affine = np.diag([*spacing, *(1.0,) * (4 - len(spacing))])
    return Volume(data, affine, data.shape, path=f"/tmp/{name}.nii.gz")  # type: ignore[arg-type]


PHANTOM_MM = (4.0, 4.0, 4.0)  # the phantom's voxels: a brain of 1.9 l, a head of 4.3 l


def _phantom(skull: bool, shape: tuple[int, ...] = (64, 72, 60)) -> np.ndarray:
    """A T1-like phantom: white matter inside grey matter, optionally dark skull and bright
    scalp around it, on a zero background. At :data:`PHANTOM_MM` voxels it has the size of a
    brain (semi-axes 77 x 86 x 72 mm) or a head (100 x 112 x 94 mm)."""
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"))
    radius = np.sqrt((grid**2).sum(0))
    rng = np.random.default_rng(0)
    image = np.where(radius < 0.5, 0.9, np.where(radius < 0.6, 0.55, 0.0))
    if skull:
        image = np.where((radius >= 0.68) & (radius < 0.78), 1.0, image)  # scalp fat
        image = np.where((radius >= 0.6) & (radius < 0.68), 0.05, image)  # skull
    return (image + 0.02 * rng.standard_normal(shape) * (image > 0)).astype(np.float32)


# --- synthetic --------------------------------------------------------------------------------


def test_label_map_versus_image_synthetic() -> None:
    labels = np.zeros((30, 40, 20), np.int32)
    labels[5:20, 5:30, 3:15] = 2
    labels[10:15, 10:20, 5:10] = 41
    assert looks_like_label_map(labels) and looks_like_label_map(labels.astype(np.float32))
    assert looks_like_label_map(labels > 0)  # a binary mask is a label map too
    image = _phantom(skull=False)
    assert not looks_like_label_map(image)
    assert not looks_like_label_map(np.rint(image * 255))  # an integer-valued image
    assert not looks_like_label_map(np.rint(image * 255) + 7)  # its air a constant 7, not 0
    assert looks_like_label_map(labels + 7)  # a label map whose background is 7
    assert not looks_like_label_map(np.zeros((8, 8)))  # constant
    noisy = labels + np.float32(0.3)
    assert not looks_like_label_map(noisy)
    with pytest.raises(ValueError, match=r"shape \(I, J\) or \(I, J, K\), got \(4,\)"):
        looks_like_label_map(np.zeros(4))


def test_skull_synthetic_phantoms() -> None:
    brain = skull_evidence(_volume(_phantom(skull=False), PHANTOM_MM))
    head = skull_evidence(_volume(_phantom(skull=True), PHANTOM_MM))
    assert brain is not None and brain.stripped is True and brain.zero_background == 1.0
    assert head is not None and head.stripped is False and head.bright_shell > 0.5
    assert 1500 < brain.size < 2500 and 3500 < head.size < 5000  # ml
    assert skull_stripped(_volume(_phantom(skull=False), PHANTOM_MM))
    assert not skull_stripped(_volume(_phantom(skull=True), PHANTOM_MM))
    assert skull_evidence(np.zeros((10, 10))) is None  # cannot tell
    assert not skull_stripped(np.zeros((10, 10)))


def test_skull_verdict_says_nothing_where_the_measures_disagree() -> None:
    # the same phantoms at 1 mm: 30 ml and 74 ml, too small for a brain or a head
    for skull in (False, True):
        evidence = skull_evidence(_volume(_phantom(skull=skull)))
        assert evidence is not None and evidence.stripped is None
        assert not skull_stripped(_volume(_phantom(skull=skull)))
    # a stripped brain with bright tissue left at its edge (as FreeSurfer's brainmask.mgz
    # keeps): a bright shell, but the size of a brain, so not called a head
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in (64, 72, 60)], indexing="ij"))
    radius = np.sqrt((grid**2).sum(0))
    rim = np.where((radius >= 0.6) & (radius < 0.66), 1.0, _phantom(skull=False))
    evidence = skull_evidence(_volume(rim.astype(np.float32), PHANTOM_MM))
    assert evidence is not None and evidence.bright_shell > 0.5 and evidence.stripped is None
    # a stripped brain with noise added to its background: not zeroed, so not called stripped
    noisy = _phantom(skull=False) + np.float32(0.05) * (radius >= 0.7)
    evidence = skull_evidence(_volume(noisy, PHANTOM_MM))
    assert evidence is not None and evidence.zero_background < 0.1
    assert evidence.stripped is not True


def test_spacing_warning() -> None:
    iso = _volume(np.zeros((4, 5, 6), np.float32), (1.0, 1.0, 1.0))
    assert spacing_warning(iso, 1.0) is None
    assert spacing_warning(iso, 0.0) is None and spacing_warning(iso, None) is None
    assert spacing_warning(iso, (1.2, 1.0, 0.8)) is None
    aniso = _volume(np.zeros((4, 5), np.float32), (1.0, 3.0), name="aniso")
    message = spacing_warning(aniso, 1.0, role="fixed")
    assert message is not None and "\n" not in message
    assert message.startswith("'/tmp/aniso.nii.gz' (fixed) has 1 x 3 mm voxels")
    assert "1 x 1 mm" in message
    assert spacing_warning(iso, 2.0) is not None  # 1 mm voxels, a 2 mm model
    with pytest.raises(ValueError, match="'factor' must be > 1"):
        spacing_warning(iso, 1.0, factor=1.0)
    with pytest.raises(ValueError, match="'model_spacing' must be one value or 3"):
        spacing_warning(iso, (1.0, 1.0))
    with pytest.raises(ValueError, match="'model_spacing' must be >= 0"):
        spacing_warning(iso, -1.0)


def test_label_grid_warning_names_both_grids() -> None:
    image = _volume(np.zeros((4, 5, 6), np.float32), (1.0, 1.0, 1.0), name="img")
    assert (
        label_grid_warning(_volume(np.zeros((4, 5, 6), np.int32), (1.0, 1.0, 1.0)), image) is None
    )
    seg = _volume(np.zeros((4, 5, 6), np.int32), (0.98, 1.0, 1.0), name="seg")
    message = label_grid_warning(seg, image)
    assert message is not None and "\n" not in message
    assert message.startswith("label map '/tmp/seg.nii.gz' (shape (4, 5, 6), 0.98 x 1 x 1 mm")
    assert "its image '/tmp/img.nii.gz' (shape (4, 5, 6), 1 x 1 x 1 mm voxels" in message
    other = _volume(np.zeros((4, 5, 7), np.int32), (1.0, 1.0, 1.0))
    assert label_grid_warning(other, image) is not None  # same voxels, another shape


def test_check_pair_contents_synthetic() -> None:
    stripped = _volume(_phantom(skull=False), PHANTOM_MM, name="brain")
    head = _volume(_phantom(skull=True), PHANTOM_MM, name="head")
    labels = _volume((_phantom(skull=False) > 0.7).astype(np.float32) * 3, name="seg")
    small = _volume(_phantom(skull=True), name="small")  # 1 mm voxels: cannot tell
    assert check_pair_contents(small, stripped, model_skull_stripped=True) == []
    assert check_pair_contents(stripped, stripped) == []
    assert check_pair_contents(stripped, stripped, model_skull_stripped=True) == []
    (mismatch,) = check_pair_contents(head, stripped)
    assert mismatch.startswith("'/tmp/head.nii.gz' (moving) looks like a head with skull")
    assert "'/tmp/brain.nii.gz' (fixed) is skull-stripped" in mismatch
    assert "mri_synthstrip" in mismatch and "\n" not in mismatch
    both = check_pair_contents(head, head, model_skull_stripped=True)
    assert len(both) == 2 and all("trained on skull-stripped brains" in w for w in both)
    (label,) = check_pair_contents(stripped, labels)
    assert label.startswith("'/tmp/seg.nii.gz' given as the fixed image looks like a label map")
    assert "--fixed-seg" in label


# --- real data ----------------------------------------------------------------------------------


@needs_data("neurite-oasis")
@pytest.mark.parametrize(
    "relative",
    [
        f"{OASIS1}/aligned_seg35.nii.gz",
        f"{OASIS2}/slice_seg24.nii.gz",
        f"{OASIS1}/aligned_seg4.nii.gz",
    ],
)
def test_real_label_maps_are_recognised(relative: str) -> None:
    assert looks_like_label_map(_load(relative))
    assert looks_like_label_map(_load(relative, label=True))


@needs_data("ixi-2mm")
@pytest.mark.parametrize("person", IXI)
def test_real_ixi_parcellations_are_label_maps_and_t1_heads_are_not(person: str) -> None:
    assert looks_like_label_map(_load(f"ixi-2mm/{person}_DLMUSE.nii.gz"))
    head = _load(f"ixi-2mm/{person}_T1.nii.gz")
    assert not looks_like_label_map(head)
    assert not skull_stripped(head)


@needs_data("ixi-2mm")
def test_every_shared_ixi_head_has_a_skull() -> None:
    heads = sorted((DATA / "ixi-2mm").glob("*_T1.nii.gz"))
    assert len(heads) == 30
    stripped = [path.name for path in heads if skull_stripped(load_volume(path))]
    assert stripped == []


@needs_data("lapirn-3d")
def test_shared_lapirn_brains_are_stripped() -> None:
    for name in ("image_A_160x192x144", "image_B_160x192x144"):
        assert skull_stripped(_load(f"lapirn-3d/{name}.nii.gz"))
        assert looks_like_label_map(_load(f"lapirn-3d/{name}_seg.nii.gz"))


@needs_data("neurite-oasis")
@pytest.mark.parametrize("person", [OASIS1, OASIS2])
def test_real_oasis_stripped_and_unstripped(person: str) -> None:
    for name in ("aligned_norm", "slice_norm"):
        brain = _load(f"{person}/{name}.nii.gz")
        assert skull_stripped(brain), name
        assert not looks_like_label_map(brain)
    head = _load(f"{person}/slice_orig.nii.gz")
    assert not skull_stripped(head) and not looks_like_label_map(head)


@needs_data("oasis1-freesurfer")
def test_real_freesurfer_norm_is_a_stripped_image_not_a_label_map() -> None:
    norm = _load("oasis1-freesurfer/OAS1_0001_MR1/norm.mgz")  # integer-valued, 187 grey values
    assert not looks_like_label_map(norm) and skull_stripped(norm)
    assert looks_like_label_map(_load("oasis1-freesurfer/OAS1_0001_MR1/aseg.mgz"))


@needs_data("neurite-oasis")
def test_real_pair_warnings() -> None:
    brain = _load(f"{OASIS1}/slice_norm.nii.gz")
    other = _load(f"{OASIS2}/slice_norm.nii.gz")
    head = _load(f"{OASIS2}/slice_orig.nii.gz")
    seg = _load(f"{OASIS2}/slice_seg24.nii.gz")
    assert check_pair_contents(other, brain, model_skull_stripped=True) == []
    (mismatch,) = check_pair_contents(head, brain)
    assert f"'{head.path}' (moving) looks like a head with skull" in mismatch
    (as_image,) = check_pair_contents(seg, brain)
    assert f"'{seg.path}' given as the moving image looks like a label map" in as_image
    assert spacing_warning(brain, 1.0) is None


@needs_data("ixi-2mm")
def test_real_ixi_head_against_stripped_oasis_and_a_1mm_model() -> None:
    head = _load(f"ixi-2mm/{IXI[0]}_T1.nii.gz")
    brain = _load(f"{OASIS1}/aligned_norm.nii.gz")
    warnings = check_pair_contents(head, brain, model_skull_stripped=True)
    assert len(warnings) == 2
    assert "looks like a head with skull but" in warnings[0]
    assert "trained on skull-stripped brains" in warnings[1]
    message = spacing_warning(head, 1.0, role="moving")
    assert message is not None and "2 x 2 x 2 mm voxels" in message


# --- every shared input, with copies (benchmarks/bench_heuristics.py --quick) ---------------

CATALOGUE = bench_heuristics.catalogue(DATA, quick=True)


@pytest.mark.parametrize(
    "case", CATALOGUE or [None], ids=[c.name for c in CATALOGUE] or ["no-shared-data"]
)
def test_no_false_alarm_on_shared_inputs(case: bench_heuristics.Case | None) -> None:
    if case is None:
        data_path("neurite-oasis")  # skips, naming the path looked at
        pytest.skip(f"no input of bench_heuristics' catalogue found under {DATA}")
    volume = case.make()
    verdict = bench_heuristics.judge(volume)
    assert verdict.wrong(case.truth) == []
    if case.truth == "label":
        assert verdict.label_map  # every shared label map (and copy) is recognised
    elif volume.ndim == 3 and max(volume.spacing) <= 2.0 + 1e-6 and case.true_header:
        assert verdict.stripped is not None  # a clear case: a 3D head or brain at 1-2 mm


@needs_data("ixi-2mm")
@needs_data("oasis1-freesurfer")
def test_reported_false_alarms_are_gone() -> None:
    """A brain-masked head as the fixed image against a stripped brain, and a resampled, a
    thick-slice and a 2D-sliced head against a head: no skull warning."""
    t1 = _load(f"ixi-2mm/{IXI[1]}_T1.nii.gz")
    seg = _load(f"ixi-2mm/{IXI[1]}_DLMUSE.nii.gz", label=True)
    norm = _load("oasis1-freesurfer/OAS1_0001_MR1/norm.mgz")
    for millimetres in (3.0, 6.0):
        brainmask = bench_heuristics.masked(t1, seg, millimetres)
        assert check_pair_contents(norm, brainmask) == []
    other = _load(f"ixi-2mm/{IXI[0]}_T1.nii.gz")
    for copy in (
        bench_heuristics.resampled(t1, 3.0, label=False),
        bench_heuristics.thick(t1, 6.0, label=False),
    ):
        assert check_pair_contents(copy, other) == []
    slices = [bench_heuristics.middle_slice(volume, 1) for volume in (t1, other)]
    assert check_pair_contents(*slices) == []
    (mismatch,) = check_pair_contents(t1, norm)  # the clear case still warns
    assert "looks like a head with skull" in mismatch
