"""λ sweeps and λ* tuning with one amortised HyperMorph model.

:func:`sweep_lambdas` (:mod:`hyperreg.registration.lambdas`, re-exported here) registers one
pair at K values of λ, in **one batched forward pass** on a GPU (one λ per pass on a CPU, faster
there). :func:`sweep_files` adds the file boundary
(CSV, figures, optional NIfTI outputs); :mod:`hyperreg.apps.tune` builds λ* tuning on it.
Grids and label maps are handled as in :func:`hyperreg.registration.lambdas.register_pair` (same
helpers). Must not import train or cli.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from hyperreg._files import write_csv
from hyperreg.registration.defaults import ChosenLambda, check_lambda, pair_lambda
from hyperreg.apps.outputs import OutputSpec, write_outputs
from hyperreg.apps.sweep_figures import sweep_figures
from hyperreg.apps.view_page import check_page_path, write_sweep_page
from hyperreg.figures.backend import preload_pyplot
from hyperreg.geometry.affine import AffineTransform
from hyperreg.geometry.intensity import DEFAULT_NORMALIZATION
from hyperreg.method.model import HyperMorph
from hyperreg.registration.lambdas import sweep_lambdas
from hyperreg.registration.pairs import PathLike, check_outputs
from hyperreg.registration.pipeline import (
    DEFAULT_INIT,
    InputError,
    PairResult,
    PreparedPair,
    load_pair,
)
from hyperreg.registration.contrast import contrast_options
from hyperreg.registration.refine import Refinement, check_refinement
from hyperreg.registration.settings import resolve_settings

__all__ = [
    "SweepReport",
    "sweep_files",
    "sweep_lambdas",
    "write_sweep_csv",
]

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# files, CSV, figures
# --------------------------------------------------------------------------------------------


def _sweep_rows(results: Sequence[PairResult]) -> list[dict[str, Any]]:
    marked = any(r.lam_reason for r in results)
    labels = sorted({label for r in results for label in (r.dice or {})})
    rows = []
    for r in results:
        row: dict[str, Any] = {
            "lambda": r.lam,
            "mean_dice": r.mean_dice if r.dice is not None else "",
        }
        for label in labels:
            row[f"dice_{label}"] = (r.dice or {}).get(label, "")
        row["folding_percent"] = 100.0 * r.folding_fraction
        row["log_jacobian_std"] = r.log_jacobian_std
        row["ncc"] = "" if r.ncc is None else r.ncc
        if r.verdict is not None:
            row["verdict"], row["kept"] = r.verdict.text, r.verdict.kept
        if marked:
            row["chosen"] = r.lam_reason
        rows.append(row)
    return rows


def write_sweep_csv(path: PathLike, results: Sequence[PairResult]) -> Path:
    """Write one row per λ: lambda, mean_dice, dice_<label>..., folding_percent,
    log_jacobian_std, ncc, verdict and kept (:class:`~hyperreg.registration.verdict.Verdict`;
    Dice columns empty without label maps), and when one result carries
    a ``lam_reason`` (the λ chosen by :func:`sweep_files`'s ``lam``) a last column ``chosen``:
    that reason on its row, empty elsewhere. Atomic."""
    rows = _sweep_rows(results)
    return write_csv(Path(path), rows, list(rows[0]) if rows else ["lambda"])


@dataclass
class SweepReport:
    """Output of :func:`sweep_files`.

    Attributes:
        results: One :class:`~hyperreg.registration.pipeline.PairResult` per λ.
        baseline_dice: Mean Dice before registration (same labels), or None without label maps.
        files: Every file written (CSV, figures, optional NIfTI outputs).
        chosen: The λ asked for with ``lam`` (``"auto"``: chosen for the pair) and why, or None.
    """

    results: list[PairResult]
    baseline_dice: float | None
    files: list[Path] = field(default_factory=list)
    chosen: ChosenLambda | None = None


def sweep_files(
    model: HyperMorph,
    moving: PathLike,
    fixed: PathLike,
    lambdas: Sequence[float],
    out: PathLike,
    *,
    moving_seg: PathLike | None = None,
    fixed_seg: PathLike | None = None,
    save_fields: bool = False,
    chunk: int | None = None,
    amp: bool = False,
    normalization: str = DEFAULT_NORMALIZATION,
    resample: bool = True,
    refine: Refinement | None = None,
    init: str = DEFAULT_INIT,
    initial_affine: AffineTransform | PathLike | None = None,
    lam: float | str | None = None,
    npz_geometry: str | None = None,
    passes: int | None = None,
    bias_correct: bool = False,
    never_worse: bool = True,
    replace_nonfinite: float | None = None,
    html: PathLike | None = None,
    contrast: str = "auto",
    fixed_mask: PathLike | None = None,
    moving_mask: PathLike | None = None,
) -> SweepReport:
    """Load a pair, sweep λ (:func:`sweep_lambdas`) and write the report to ``out``.

    Writes ``sweep.csv`` (:func:`write_sweep_csv`), ``sweep_curves.png`` (Dice on an axis
    fitted to it, std log J and folding against λ), ``sweep_montage.png`` (moved image and
    displacement magnitude per λ, six λ a row, with a colour bar in voxels; for 3D the middle
    slice of the plane normal to the last array axis) and ``sweep_qc.png`` (checkerboard,
    fixed-image edges and difference before and after registration at the λ with the best mean
    Dice, or the middle λ without label maps; the three planes of a 3D image); see
    :mod:`hyperreg.apps.sweep_figures`. Slices
    are shown in :data:`~hyperreg.figures.slices.DISPLAY_CONVENTION`, oriented from the fixed
    image's affine, and the figures say so. With ``save_fields``, per λ also
    ``moved_lam<λ>.nii.gz``, ``warp_lam<λ>.nii.gz`` (voxel format, see
    :func:`hyperreg.geometry.fields.save_displacement`) and ``moved_seg_lam<λ>.nii.gz``, each with
    the fixed image's affine: what :func:`hyperreg.apps.register.register_files` writes at that
    λ with the same options, so with an affine stage the warp is the **composed** transform
    (affine then deformable field, :func:`hyperreg.registration.chain.composed_displacement`)
    and the moved image and label map are sampled once from the original files through it.
    Every input is read and checked before anything is written.

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph`.
        moving: Moving image file.
        fixed: Fixed image file; every output is on its grid.
        lambdas: λ values (see :func:`hyperreg.apps.inputs.parse_lambdas`).
        out: Output folder (created).
        moving_seg: Moving label map file, or None.
        fixed_seg: Fixed label map file, or None; Dice needs both.
        save_fields: Also write the NIfTI outputs per λ.
        chunk: See :func:`sweep_lambdas`.
        amp: See :func:`sweep_lambdas`.
        normalization: Intensity normalisation.
        resample: Resample inputs on other grids onto the fixed grid (default True, as in
            :func:`hyperreg.apps.register.register_files`).
        refine: Test-time refinement of each λ's field
            (:func:`hyperreg.registration.refine.refine_pair`, one optimisation per λ, after
            the batched pass); None or 0 steps: the network's fields.
        init: ``"affine"`` (default), ``"rigid"`` or ``"none"``: the affine stage, computed
            once for the pair (:func:`hyperreg.registration.pipeline.load_pair`); every λ then
            registers the aligned pair. Dice "before" is that with no registration.
        initial_affine: An initial transform or ITK ``.mat``/``.tfm`` file: the affine stage
            starts from it, or with ``init="none"`` it is used as is (once for the sweep).
        lam: A λ to mark among the results (``chosen`` column of ``sweep.csv``), or None:
            ``"auto"`` chooses it for the pair without labels
            (:func:`hyperreg.registration.defaults.pair_lambda`), a number marks that λ; it is
            added to ``lambdas`` when missing.
        npz_geometry: Geometry of npz inputs (no header): ``"fixed"``, ``"identity"`` or None
            (an npz input is an error), see :func:`hyperreg.registration.inputs.load_input`.
        passes: Network passes per λ, composed (:func:`hyperreg.registration.passes.
            register_passes`; batched over the λ pass by pass,
            :func:`hyperreg.registration.engine.run`); None (default): the model's own
            (``model.config.passes``).
        bias_correct: Remove each image's bias field (N4) before the affine stage and the
            network (:func:`hyperreg.registration.pipeline.model_image`); outputs are still
            sampled from the files as read.
        never_worse: Replace a λ's registration that lowered the model's similarity by the
            better of the affine alone and the pair as it came (default True; sweep.csv's
            ``verdict`` and ``kept`` say so); False keeps every field as the model gave it
            (:meth:`~hyperreg.registration.pipeline.PreparedPair.register`).
        replace_nonfinite: The value NaN/inf voxels of the images take (logged with their
            count); None (default): such an image is an error.
        html: Output HTML file of the self-contained sweep page
            (:func:`hyperreg.apps.view_page.write_sweep_page`), or None.
        contrast: ``"auto"`` (default), ``"same"`` or ``"different"``: what the network
            sees and the similarity each λ is refined and judged by, as in
            :func:`hyperreg.apps.register.register_files` (the λ given are kept).
        fixed_mask, moving_mask: Cost masks (0/1 files; ANTs' ``-x``), or None: see
            :func:`~hyperreg.registration.pipeline.load_pair`.

    Returns:
        A :class:`SweepReport`.

    Raises:
        FileNotFoundError: If an input is missing.
        ValueError: As :func:`sweep_lambdas` and :func:`hyperreg.geometry.io.load_volume`.
    """
    from hyperreg.geometry.intensity import intensity_window, normalize_intensity

    fn = "sweep_files"
    _check_sweep(fn, lambdas, save_fields=save_fields, refine=refine, lam=lam, html=html)
    if lambdas:  # an option no path honours (e.g. amp with refinement): before the affine stage
        resolve_settings(model, lambdas, refine, chunk=chunk, amp=amp, passes=passes, fn=fn)
    preload_pyplot()  # for the figures, while the affine stage leaves a core idle
    pair = load_pair(
        moving,
        fixed,
        model=model,
        moving_seg=moving_seg,
        fixed_seg=fixed_seg,
        init=init,
        initial_affine=initial_affine,
        normalization=normalization,
        resample=resample,
        npz_geometry=npz_geometry,
        bias_correct=bias_correct,
        replace_nonfinite=replace_nonfinite,
        fixed_mask=fixed_mask,
        moving_mask=moving_mask,
        contrast=contrast,
    )
    chosen = None if lam is None else pair_lambda(pair, model, lam)
    lambdas = list(lambdas)
    if chosen is not None and not any(_same_lambda(v, chosen) for v in lambdas):
        lambdas.append(chosen.lam)
    options = dict(chunk=chunk, amp=amp, ncc=True, passes=passes, never_worse=never_worse)
    results = pair.register(model, lambdas, **options, **contrast_options(pair, contrast, refine))
    for given, r in zip(lambdas, results):
        if chosen is not None and _same_lambda(given, chosen):
            r.lam_reason = chosen.reason
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [write_sweep_csv(out_dir / "sweep.csv", results)]
    raw = pair.aligned.data
    units = intensity_window(raw, normalization)
    files += sweep_figures(
        out_dir,
        normalize_intensity(raw, normalization),
        normalize_intensity(pair.fixed.data, normalization),
        results,
        pair,
        units,
    )
    if save_fields:
        files += _save_fields(out_dir, pair, results, lambdas)
    if html is not None:
        files.append(write_sweep_page(html, pair, results, None if chosen is None else chosen.lam))
    return SweepReport(results=results, baseline_dice=pair.dice_before, files=files, chosen=chosen)


def _check_sweep(
    fn: str,
    lambdas: Sequence[float],
    *,
    save_fields: bool,
    refine: Refinement | None,
    lam: float | str | None,
    html: PathLike | None,
) -> None:
    """The checks of :func:`sweep_files` that need no file: no repeated λ with
    ``save_fields`` (each λ names its files), the refinement, ``lam`` and the page path."""
    repeated = sorted({float(v) for v in lambdas if list(lambdas).count(v) > 1})
    if save_fields and repeated:
        raise InputError(
            fn,
            "{0} repeats {repeated}; with {1} each λ needs its own file names",
            "lambdas",
            "save_fields",
            repeated=repeated,
        )
    if refine is not None:
        check_refinement(fn, refine)
    check_lambda(fn, lam)
    check_page_path(fn, html)


def _same_lambda(given: float, chosen: ChosenLambda) -> bool:
    """``given`` is the chosen λ (to 1e-9)."""
    return abs(float(given) - chosen.lam) < 1e-9


def _save_fields(
    out_dir: Path, pair: PreparedPair, results: Sequence[PairResult], lambdas: Sequence[float]
) -> list[Path]:
    """Per λ: moved_lam<λ>, warp_lam<λ> (the whole transform) and moved_seg_lam<λ>."""
    files = []
    for r, lam in zip(results, lambdas):
        tag = f"lam{float(lam):.10g}"  # the λ as given (r.lam went through float32)
        paths = {"moved": out_dir / f"moved_{tag}.nii.gz", "warp": out_dir / f"warp_{tag}.nii.gz"}
        check_outputs("sweep_files", **paths)
        seg_path = out_dir / f"moved_seg_{tag}.nii.gz" if r.moved_seg is not None else None
        spec = OutputSpec(moved=paths["moved"], warp_out=paths["warp"], moved_seg=seg_path)
        write_outputs(spec, r, pair)
        files += [Path(p) for p in spec.paths().values() if p is not None]
    return files
