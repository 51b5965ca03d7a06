"""The PNG figures' layout: three planes in 3D, the montage wraps (bounded width), the sweep
curves show std log J on their own axis and Dice on an axis fitted to it, the QC titles fit
their panels, and evaluate's box plot stays bounded past 150 structures. Sizes and panel
counts, not pixel values."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from PIL import Image

import hyperreg.figures.backend as backend
from hyperreg.apps import sweep_figures
from hyperreg.figures.alignment import alignment_figure
from hyperreg.figures.curves import dice_limits, sweep_curves
from hyperreg.figures.structures import structure_boxplots


@pytest.fixture()
def figures(monkeypatch) -> list[Any]:
    """Every figure saved, kept open for inspection (the file is still written)."""
    kept: list[Any] = []
    real = backend.save_figure

    def keep(fig, path, dpi=110):
        fig.canvas.draw()  # lay out, as savefig does, before the figure is closed
        renderer = fig.canvas.get_renderer()
        widths = [
            (ax.get_title(), ax.title.get_window_extent(renderer).width,
             ax.get_window_extent(renderer).width)
            for ax in fig.axes if ax.images
        ]  # fmt: skip
        kept.append(SimpleNamespace(fig=fig, widths=widths))
        return real(fig, path, dpi=dpi)

    import hyperreg.figures.alignment as alignment
    import hyperreg.figures.curves as curves
    import hyperreg.figures.structures as structures

    for module in (alignment, curves, structures, sweep_figures):
        monkeypatch.setattr(module, "save_figure", keep)
    return kept


def _size(path: Path) -> tuple[int, int]:
    with Image.open(path) as image:
        return image.size


def _images(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if ax.images]


def test_a_3d_alignment_figure_shows_three_planes(tmp_path: Path, figures) -> None:
    rng = np.random.default_rng(0)
    fixed = rng.random((16, 20, 12))
    seg = (fixed > 0.5).astype(np.int32)
    alignment_figure(tmp_path / "a.png", fixed, fixed[::-1], np.eye(4), moving=fixed,
                     fixed_seg=seg, moved_seg=seg[::-1], moving_seg=seg)  # fmt: skip
    titles = [ax.get_title() for ax in _images(figures[-1].fig)]
    for plane in ("axial", "coronal", "sagittal"):
        assert sum(plane in t for t in titles) == 2 * 5  # before and after rows, 5 panels each
    for title, title_width, panel_width in figures[-1].widths:  # titles within their panels
        assert title_width <= 1.15 * panel_width, title
    alignment_figure(tmp_path / "b.png", fixed[..., 0], fixed[::-1, :, 0], np.eye(4))
    assert len(_images(figures[-1].fig)) == 4  # 2D: one plane, one row


def _results(count: int, shape: tuple[int, ...], dice: bool = True) -> list[Any]:
    rng = np.random.default_rng(1)
    return [
        SimpleNamespace(
            lam=lam,
            moved=rng.random(shape),
            disp=rng.random((len(shape), *shape)),
            dice={1: 0.5} if dice else None,
            mean_dice=0.45 + 0.05 * lam,
            folding_fraction=0.0,
            log_jacobian_std=0.6 - 0.5 * lam,
        )
        for lam in np.linspace(0, 1, count)
    ]


def test_the_montage_wraps_into_rows_of_bounded_width(tmp_path: Path, figures) -> None:
    shape = (48, 56)
    image = np.random.default_rng(2).random(shape)
    pair = SimpleNamespace(fixed=SimpleNamespace(affine=np.eye(4)), chained=False,
                           dice_before=0.2, dice_affine=0.4)  # fmt: skip
    paths = sweep_figures.sweep_figures(tmp_path, image, image, _results(12, shape), pair)
    width, height = _size(paths[1])
    assert width <= 1500 and height <= 1000, (width, height)
    montage = figures[1].fig
    assert len(_images(montage)) == 2 + 2 * 12  # moving, fixed, then moved and |u| per λ
    few = sweep_figures.sweep_figures(tmp_path, image, image, _results(3, shape), pair)
    assert _size(few[1])[0] < width  # three λ: one row of four columns
    volume = np.random.default_rng(5).random((20, 24, 16))
    paths = sweep_figures.sweep_figures(tmp_path, volume, volume, _results(12, volume.shape), pair)
    width, height = _size(paths[1])
    assert width <= 1500 and height <= 2000, (width, height)
    titles = [t for t, _, _ in figures[1 + 3 * 2].widths]  # the 3D montage
    assert len(titles) == 3 + 1 + 12 * (3 + 1)  # fixed in 3 planes, moving; 3 planes and |u|
    assert [t for t in titles if t.startswith("fixed")] == [
        "fixed, axial",
        "fixed, coronal",
        "fixed, sagittal",
    ]


def test_sweep_curves_show_std_log_j_and_a_fitted_dice_axis(tmp_path: Path, figures) -> None:
    lams = [0.0, 0.25, 0.5, 0.75, 1.0]
    sweep_curves(tmp_path / "c.png", lams, [0.0] * 5, [0.6, 0.4, 0.3, 0.2, 0.15],
                 dice=[0.45, 0.47, 0.5, 0.49, 0.46], dice_before=0.1, dice_affine=0.46)  # fmt: skip
    fig = figures[-1].fig
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert "mean Dice" in labels and "std log J" in labels and "% voxels with J ≤ 0" in labels
    dice_axis = fig.axes[labels.index("mean Dice")]
    low, high = dice_axis.get_ylim()
    assert 0.4 < low < 0.45 and 0.5 < high < 0.55  # fitted, not 0-1
    legend = [t.get_text() for t in dice_axis.get_legend().get_texts()]
    assert "no registration 0.100 below" in legend and "affine alone 0.460" in legend
    sweep_curves(tmp_path / "d.png", lams, [0.0] * 5, [0.6, 0.4, 0.3, 0.2, 0.15])
    assert [ax.get_ylabel() for ax in figures[-1].fig.axes] == ["std log J", "% voxels with J ≤ 0"]


@pytest.mark.parametrize(
    ("dice", "expected"),
    [
        ([0.45, 0.5], (0.44, 0.51)),
        ([0.3, 0.7], (0.26, 0.74)),
        ([0.7, 0.7], (0.69, 0.71)),
        ([0.0, 1.0], (0.0, 1.0)),
    ],
)
def test_dice_limits(dice: list[float], expected: tuple[float, float]) -> None:
    assert dice_limits(dice) == pytest.approx(expected)


def test_qc_figure_has_three_planes_in_3d_and_titles_that_fit(tmp_path: Path, figures) -> None:
    shape = (20, 24, 16)
    image = np.random.default_rng(3).random(shape)
    pair = SimpleNamespace(fixed=SimpleNamespace(affine=np.eye(4)), chained=True,
                           dice_before=0.2, dice_affine=0.4)  # fmt: skip
    sweep_figures.sweep_figures(tmp_path, image, image, _results(3, shape), pair)
    qc = figures[-1].fig
    panels = _images(qc)
    assert len(panels) == 3 * 2 * 3  # three planes, before and after, three views each
    for title, title_width, panel_width in figures[-1].widths:  # titles within their panels
        assert title_width <= 1.15 * panel_width, title


def test_evaluate_box_plot_stays_bounded_past_150_structures(tmp_path: Path, figures) -> None:
    rng = np.random.default_rng(4)
    count = 160
    names = [f"structure number {i}" for i in range(count)]
    dice = [list(rng.random(5)) for _ in range(count)]
    hd95 = [list(10 * rng.random(5)) for _ in range(count)]
    width, height = _size(structure_boxplots(tmp_path / "e.png", names, dice, hd95))
    assert width <= 1200 and height <= 1100, (width, height)
    shown = [t.get_text() for t in figures[-1].fig.axes[0].get_yticklabels()]
    medians = {n: np.median(d) for n, d in zip(names, dice)}
    lowest = sorted(names, key=medians.get)[:20]
    assert shown == lowest  # the lowest 20 by median Dice, lowest first, named
    few = structure_boxplots(tmp_path / "f.png", names[:5], dice[:5], hd95[:5])
    assert _size(few)[1] < height


def test_register_figure_of_slices_in_different_world_planes(tmp_path: Path, figures) -> None:
    """The moving slice 12 mm off the fixed one's plane: nothing of it reaches the fixed grid
    through the headers, so the figure shows the moved image alone (no black 'before' row)."""
    import nibabel as nib
    from lambda_helpers import save_tiny_model, write_pair

    from hyperreg.cli import main

    files = write_pair(tmp_path, "p")
    image = nib.load(files["moving"])
    shifted = image.affine.copy()
    shifted[:3, 3] += 12 * shifted[:3, 2]  # along the slice normal
    nib.save(nib.Nifti1Image(np.asarray(image.dataobj), shifted), files["moving"])
    args = ["register", "--model", str(save_tiny_model(tmp_path / "m.pt")), "--moving",
            str(files["moving"]), "--fixed", str(files["fixed"]), "--moved",
            str(tmp_path / "moved.nii.gz"), "--lambda", "0.5", "--figure"]  # fmt: skip
    assert main([*args, str(tmp_path / "f.png")]) == 0
    titles = [t for t, _, _ in figures[-1].widths]
    assert len(titles) == 4 and all(t.startswith("after") for t in titles)
    assert "does not reach the fixed grid" in figures[-1].fig._suptitle.get_text()
    moved = np.asarray(nib.load(tmp_path / "moved.nii.gz").dataobj)
    assert moved.std() > 0  # the moved image is not blank


def test_evaluate_with_150_named_structures_draws_a_bounded_named_plot(
    tmp_path: Path, figures
) -> None:
    """evaluate on label maps with 150 structures and an id,name CSV: the box plot stays within
    a width limit and names its structures (the lowest by median Dice first)."""
    from lambda_helpers import write_nifti

    from hyperreg.cli import main

    fixed = np.repeat(np.arange(1, 151, dtype=np.uint8), 4).reshape(30, 20)  # 150 bands
    moved = np.roll(fixed, 1, axis=1)  # a shift: a different Dice per structure
    moved[:15] = fixed[:15]  # the top half's structures untouched: Dice 1
    write_nifti(tmp_path / "fixed_seg.nii.gz", fixed[..., None])
    write_nifti(tmp_path / "moved_seg.nii.gz", moved[..., None])
    (tmp_path / "pairs.csv").write_text("moved_seg,fixed_seg\nmoved_seg.nii.gz,fixed_seg.nii.gz\n")
    names = tmp_path / "names.csv"
    names.write_text("id,name\n" + "".join(f"{i},region-{i}\n" for i in range(1, 151)))
    args = ["evaluate", "--pairs", str(tmp_path / "pairs.csv"), "--out", str(tmp_path / "out")]
    assert main([*args, "--label-names", str(names)]) == 0
    width, height = _size(tmp_path / "out" / "evaluation_boxplot.png")
    assert width <= 1200 and height <= 1100, (width, height)
    shown = [t.get_text() for t in figures[-1].fig.axes[0].get_yticklabels()]
    assert len(shown) == 20 and all(name.startswith("region-") for name in shown)
    assert {int(name.split("-")[1]) for name in shown} <= set(range(76, 151))  # shifted ones


def test_tune_png_has_std_log_j_a_fitted_dice_axis_and_a_title_clear_of_the_panels(
    tmp_path: Path, figures
) -> None:
    from hyperreg.apps.tune_report import TuneResult, write_tune_report

    lams = [0.0, 0.1, 0.3, 0.6, 0.9]
    dice, sdlogj = [0.621, 0.669, 0.665, 0.640, 0.449], [0.65, 0.21, 0.15, 0.10, 0.08]
    rows = [
        {"lambda": lam, "stage": "coarse", "mean_dice": d, "folding_percent": 0.01,
         "log_jacobian_std": s, "feasible": True}
        for lam, d, s in zip(lams, dice, sdlogj)
    ]  # fmt: skip
    result = TuneResult(lambda_star=0.1, dice_at_star=0.669, folding_percent_at_star=0.01,
                        constraint_met=True, per_label={}, grid=rows, pairs=3, max_folding=0.5,
                        lambda_star_range=(0.1, 0.3), dice_tolerance=0.01,
                        dice_before=0.2)  # fmt: skip
    paths = write_tune_report(result, tmp_path)
    assert paths[-1].name == "tune.png" and paths[-1].is_file()
    fig = figures[-1].fig
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert "mean Dice" in labels and "std log J" in labels and "% voxels with J ≤ 0" in labels
    dice_axis = fig.axes[labels.index("mean Dice")]
    low, high = dice_axis.get_ylim()
    assert 0.4 < low < 0.449 and 0.669 < high < 0.7  # fitted, not 0-1
    legend = [t.get_text() for t in dice_axis.get_legend().get_texts()]
    assert "λ* = 0.1" in " ".join(legend) and "no registration 0.200 below" in legend
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the saved figure was closed: draw it again to measure
    canvas.draw()
    renderer = canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    for ax in fig.axes:  # the title overlaps no panel (display coordinates: y grows upwards)
        assert title.y0 >= ax.get_window_extent(renderer).y1
    width, height = _size(paths[-1])
    assert width <= 900 and height <= 900, (width, height)
