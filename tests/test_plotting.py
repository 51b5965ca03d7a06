"""Figure helpers: one display convention from the affine, checkerboard and edge views."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
from nibabel.orientations import apply_orientation, axcodes2ornt, inv_ornt_aff, ornt_transform

from hyperreg.figures.alignment import alignment_figure
from hyperreg.figures.backend import pyplot
from hyperreg.figures.curves import plot_lambda_curves
from hyperreg.figures.overlays import edge_mask, label_boundaries
from hyperreg.figures.slices import DISPLAY_CONVENTION, checkerboard, oriented_slice, show_slice

SHAPE = (5, 6, 7)  # odd and even lengths: the middle slice must not depend on the flip


def _ras_volume() -> tuple[np.ndarray, np.ndarray]:
    """An asymmetric volume stored in RAS order (distinct values) and its affine."""
    data = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE) ** 1.5
    affine = np.diag([2.0, 1.0, 3.0, 1.0])
    affine[:3, 3] = [-4.0, -2.5, -9.0]
    return data, affine


def _reorient(data: np.ndarray, affine: np.ndarray, codes: str) -> tuple[np.ndarray, np.ndarray]:
    """The same image stored in ``codes`` orientation (data and affine), via nibabel."""
    start = nib.orientations.io_orientation(affine)
    transform = ornt_transform(start, axcodes2ornt(tuple(codes)))
    stored = apply_orientation(data, transform)
    # world of the new voxels: old affine composed with new-voxel -> old-voxel
    new_affine = affine @ inv_ornt_aff(transform, data.shape)
    assert "".join(nib.aff2axcodes(new_affine)) == codes
    return stored, new_affine


# expected views of the RAS volume, written out by hand for DISPLAY_CONVENTION == neurological:
# columns run along +x (R) or, for sagittal, +y (A); rows run from the top (+z or +y) down
def _expected(data: np.ndarray, plane: str) -> np.ndarray:
    if plane == "axial":
        return data[:, :, SHAPE[2] // 2].T[::-1]  # (y, x), anterior at the top
    if plane == "coronal":
        return data[:, SHAPE[1] // 2, :].T[::-1]  # (z, x), superior at the top
    return data[SHAPE[0] // 2, :, :].T[::-1]  # sagittal (z, y)


def test_convention_is_stated() -> None:
    assert DISPLAY_CONVENTION == "neurological"
    data, affine = _ras_volume()
    view = oriented_slice(data, affine, "coronal")
    assert (view.left, view.right, view.top, view.bottom) == ("L", "R", "S", "I")
    assert view.label == "coronal, L ◀ ▶ R (neurological)"


@pytest.mark.parametrize("codes", ["RAS", "LIA", "LPS", "PIR", "ASL", "IRP", "SLA"])
@pytest.mark.parametrize("plane", ["axial", "coronal", "sagittal"])
def test_3d_view_is_the_same_in_every_stored_orientation(codes: str, plane: str) -> None:
    data, affine = _ras_volume()
    stored, stored_affine = _reorient(data, affine, codes)
    view = oriented_slice(stored, stored_affine, plane)
    np.testing.assert_array_equal(view.data, _expected(data, plane))
    assert view.plane == plane


@pytest.mark.parametrize("codes", ["RAS", "LIA", "PIR"])
def test_3d_default_plane_is_normal_to_the_last_array_axis(codes: str) -> None:
    data, affine = _ras_volume()
    stored, stored_affine = _reorient(data, affine, codes)
    plane = {"S": "axial", "I": "axial", "A": "coronal", "P": "coronal"}.get(codes[2], "sagittal")
    view = oriented_slice(stored, stored_affine)
    assert view.plane == plane
    np.testing.assert_array_equal(view.data, _expected(data, plane))


@pytest.mark.parametrize("codes", ["RSA", "LIA", "ILA", "SRP", "LSP"])
def test_2d_slice_displays_identically_in_any_orientation(codes: str) -> None:
    """A coronal (I, J, 1) slice: RAS-ordered data stored as LIA etc. looks the same."""
    data, affine = _ras_volume()
    coronal = data[:, 2:3, :]  # (x, 1, z): one coronal slice of the RAS volume
    expected = coronal[:, 0, :].T[::-1]
    stored, stored_affine = _reorient(coronal, affine, codes[0] + codes[2] + codes[1])
    stored, stored_affine = _reorient(stored, stored_affine, codes)  # slice axis last
    assert stored.shape[2] == 1
    view = oriented_slice(stored[:, :, 0], stored_affine)
    assert view.plane == "coronal"
    np.testing.assert_array_equal(view.data, expected)


def test_lia_slice_shows_right_superior_at_the_top_right() -> None:
    """Independent of the reorientation code: a voxel placed by its world position."""
    affine = np.array([[-1.0, 0, 0, 80], [0, 0, 1, -0.5], [0, -1, 0, 96], [0, 0, 0, 1]])  # LIA
    image = np.zeros((160, 192), dtype=np.float32)
    # world x = +40 (subject's right), z = +60 (superior): voxel i = 80 - x, j = 96 - z
    image[80 - 40, 96 - 60] = 1.0
    view = oriented_slice(image, affine)
    row, col = np.argwhere(view.data == 1.0)[0]
    assert view.data.shape == (192, 160)
    assert row < 96 and col > 80  # top half, right half: superior up, right on the right
    # row 0 is j = 0 (the most superior, z = 96); column 0 is i = 159 (x = -79, the left)
    assert (row, col) == (96 - 60, 159 - (80 - 40))


def test_oriented_slice_rejects() -> None:
    data, affine = _ras_volume()
    with pytest.raises(ValueError, match="'plane' must be one of"):
        oriented_slice(data, affine, "transverse")
    with pytest.raises(ValueError, match="'plane' of a 2D image"):
        oriented_slice(data[:, :, 0], affine, "coronal")  # an axial RAS slice
    with pytest.raises(ValueError, match="'image' must have shape"):
        oriented_slice(data[0, 0], affine)
    with pytest.raises(ValueError, match="'affine' must be a finite"):
        oriented_slice(data, affine[:3])


def test_show_slice_draws_the_oriented_view() -> None:
    plt = pyplot()
    data, affine = _ras_volume()
    stored, stored_affine = _reorient(data, affine, "LIA")
    fig, ax = plt.subplots()
    shown = show_slice(ax, stored, "t", stored_affine, letters=True)
    np.testing.assert_array_equal(shown.get_array(), _expected(data, "coronal"))
    assert sorted(t.get_text() for t in ax.texts) == ["I", "L", "R", "S"]
    plt.close(fig)


def test_checkerboard_exact_values() -> None:
    first = np.zeros((3, 5), dtype=np.int64)
    second = np.ones((3, 5), dtype=np.int64)
    # squares=2 along the longer side (5): tiles of ceil(5 / 2) = 3 pixels
    np.testing.assert_array_equal(
        checkerboard(first, second, squares=2),
        [[0, 0, 0, 1, 1], [0, 0, 0, 1, 1], [0, 0, 0, 1, 1]],
    )
    a = np.arange(16).reshape(4, 4)
    b = -a
    np.testing.assert_array_equal(
        checkerboard(a, b, squares=4),
        [[0, -1, 2, -3], [-4, 5, -6, 7], [8, -9, 10, -11], [-12, 13, -14, 15]],
    )
    np.testing.assert_array_equal(checkerboard(a, b, squares=1), a)


def test_checkerboard_rejects() -> None:
    with pytest.raises(ValueError, match="'first' and 'second'"):
        checkerboard(np.zeros((2, 3)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="'squares'"):
        checkerboard(np.zeros((2, 3)), np.zeros((2, 3)), squares=0)


def test_edge_mask_finds_a_step() -> None:
    image = np.zeros((4, 6))
    image[:, 3:] = 1.0  # np.gradient is 0.5 in columns 2 and 3, 0 elsewhere
    expected = np.zeros((4, 6), dtype=bool)
    expected[:, 2:4] = True
    np.testing.assert_array_equal(edge_mask(image, fraction=1.0), expected)
    assert not edge_mask(np.ones((3, 3))).any()
    with pytest.raises(ValueError, match="'fraction'"):
        edge_mask(image, fraction=0.0)


def test_label_boundaries_outline_both_sides() -> None:
    labels = np.zeros((5, 6), dtype=np.int32)
    labels[1:4, 2:5] = 7
    edges = label_boundaries(labels)
    inside = np.zeros_like(edges)
    inside[2, 3] = True  # the one pixel of label 7 with no other label beside it
    assert edges[1:4, 2:5].sum() == 8 and not edges[2, 3]
    assert edges[0, 2] and edges[2, 1] and not edges[0, 0]
    with pytest.raises(ValueError, match="'labels' must be 2D"):
        label_boundaries(np.zeros(4))


def _legend_texts(ax) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()]


def test_lambda_curves_name_each_baseline_truthfully() -> None:
    plt = pyplot()
    fig, ax = plt.subplots()
    lams, dice, folding = [0.1, 0.5, 0.9], [0.7, 0.72, 0.69], [0.2, 0.05, 0.0]
    plot_lambda_curves(ax, lams, dice, folding, dice_before=0.41, dice_affine=0.52)
    texts = _legend_texts(ax)
    assert "no registration" in texts and "affine alone" in texts
    plt.close(fig)
    # one number from an older caller: never called "no registration" (it is often the
    # affine-alone Dice), unless the caller says so
    fig, ax = plt.subplots()
    plot_lambda_curves(ax, lams, dice, folding, baseline=0.52)
    texts = _legend_texts(ax)
    assert "no registration" not in texts
    assert "Dice before the deformable stage (after the affine, if any)" in texts
    plt.close(fig)
    fig, ax = plt.subplots()
    plot_lambda_curves(ax, lams, dice, folding, baseline=0.52, baseline_label="affine alone")
    assert "affine alone" in _legend_texts(ax)
    plt.close(fig)


def test_alignment_figure_panels_say_what_they_show(tmp_path, monkeypatch) -> None:
    plt = pyplot()
    titles: list[str] = []
    real_save = plt.Figure.savefig

    def record(fig, *args, **kwargs):
        titles.extend(ax.get_title() for ax in fig.axes if ax.get_title())
        titles.append(fig._suptitle.get_text())
        return real_save(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", record)
    affine = np.array([[-1.0, 0, 0, 80], [0, 0, 1, -0.5], [0, -1, 0, 96], [0, 0, 0, 1]])
    rng = np.random.default_rng(0)
    fixed = rng.random((24, 20)).astype(np.float32)
    seg = np.zeros((24, 20), np.int32)
    seg[5:15, 4:12] = 3
    path = alignment_figure(
        tmp_path / "qc.png",
        fixed,
        np.roll(fixed, 1, 0),
        affine,
        moving=np.roll(fixed, 3, 0),
        moving_title="moving after the affine stage",
        fixed_seg=seg,
        moved_seg=np.roll(seg, 1, 0),
        moving_seg=np.roll(seg, 3, 0),
        title="a.nii.gz to b.nii.gz at λ = 0.5",
    )
    assert path.stat().st_size > 5_000
    joined = " | ".join(t.replace("\n", " ") for t in titles)  # titles wrap to their panels
    for text in (
        "before: moving after the affine stage",
        "after: fixed edges (red) on moved",
        "after: checkerboard moved / fixed",
        "after: |moved − fixed|",
        "label borders, fixed yellow",
        "a.nii.gz to b.nii.gz at λ = 0.5. alignment check; coronal",
    ):
        assert text in joined, text
    titles.clear()
    alignment_figure(tmp_path / "plain.png", fixed, fixed, affine)  # no labels, no before row
    assert not any("label" in t for t in titles) and not any("before" in t for t in titles)
    with pytest.raises(ValueError, match="'moved' must have the shape of 'fixed'"):
        alignment_figure(tmp_path / "bad.png", fixed, fixed[:3], affine)
