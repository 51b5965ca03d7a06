"""Register scan pairs with a trained model at a chosen λ, and apply or inspect saved fields.

:func:`register_files` registers files: on top of
:func:`hyperreg.registration.pairs.register_pair` (loaded volumes in, numpy out) it loads and
validates every input first, registers, and only then writes the outputs (each atomically), so
bad input never leaves half-written files. Registration is voxel-to-voxel on the fixed grid: a
moving image (or label map) on another grid is first resampled onto it through both affines
(:func:`hyperreg.geometry.resample.resample_to`), unless resampling is turned off, in which case
differing grids are an error. Applying or inspecting a saved field afterwards is
:mod:`hyperreg.apps.transforms`. Must not import train or cli.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from hyperreg._checks import check_option
from hyperreg._errors import InputError, passed_as
from hyperreg.apps.models import DefaultSteps, check_lambda, pair_lambda, pair_refinement
from hyperreg.apps.transforms import check_transform_path
from hyperreg.geometry.affine import AffineTransform, save_affine
from hyperreg.geometry.fields import DISPLACEMENT_FORMATS, check_itk_grid, save_displacement
from hyperreg.geometry.io import save_volume
from hyperreg.method.model import HyperMorph
from hyperreg.registration.inputs import load_input
from hyperreg.registration.pairs import PathLike, check_outputs
from hyperreg.registration.pipeline import (
    DEFAULT_INIT,
    DEFAULT_NORMALIZATION,
    PairResult,
    PreparedPair,
    load_pair,
)
from hyperreg.registration.refine import Refinement, check_refinement

__all__ = [
    "alignment_png",
    "register_files",
    "write_result",
]

logger = logging.getLogger(__name__)


def register_files(
    model: HyperMorph,
    moving: PathLike,
    fixed: PathLike,
    lam: float | str | None = None,
    *,
    moved: PathLike | None = None,
    warp_out: PathLike | None = None,
    moving_seg: PathLike | None = None,
    fixed_seg: PathLike | None = None,
    moved_seg: PathLike | None = None,
    normalization: str = DEFAULT_NORMALIZATION,
    resample: bool = True,
    warp_format: str = "voxel",
    refine: Refinement | DefaultSteps | None = None,
    inverse_warp_out: PathLike | None = None,
    init: str = DEFAULT_INIT,
    affine_out: PathLike | None = None,
    field_out: PathLike | None = None,
    initial_affine: AffineTransform | PathLike | None = None,
    npz_geometry: str | None = None,
    figure: PathLike | None = None,
    passes: int | None = None,
    bias_correct: bool = False,
    never_worse: bool = True,
    replace_nonfinite: float | None = None,
    fixed_mask: PathLike | None = None,
    moving_mask: PathLike | None = None,
) -> PairResult:
    """Load, register and write one pair at one λ (``hyperreg register``).

    A shell around :func:`hyperreg.registration.pipeline.load_pair` and
    :meth:`~hyperreg.registration.pipeline.PreparedPair.register`: every output path is checked
    and every input read and checked first, then the pair is registered, and only then are the
    outputs written (each atomically, with the fixed image's affine and disk layout). With
    ``init="affine"`` (the default, here as on the command line) or ``"rigid"`` a world-space
    affine stage runs first (Mattes MI, so it works across contrasts; the identity is kept when
    it does not help), and the moved image and label map are sampled **once** from the original
    files through the chain (:mod:`hyperreg.registration.chain`). Frames and units: the affine
    maps a fixed world point to a moving one, RAS mm in memory and LPS mm in ``affine_out``
    (ITK's convention); ``warp_out`` holds the **composed** transform as one displacement field
    on the fixed grid (voxel format: fixed voxels, i/j/k order, ``moved[x] = moving(x + w(x))``
    with the moving file resampled through the headers; ITK format: LPS mm, applied by
    ``antsApplyTransforms``/SimpleITK to the moving file in one step), and ``field_out`` the
    deformable field alone.

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph`.
        moving: Moving image file (NIfTI, MGZ or npz).
        fixed: Fixed image file; every output takes its grid, affine and disk layout.
        lam: λ in [0, 1]; None (default): the model's default λ
            (:func:`hyperreg.apps.models.model_default_lambda`); ``"auto"``: chosen for the pair
            without labels (:func:`hyperreg.apps.models.pair_lambda`, one batched sweep first).
            Why is in the result's ``lam_reason``.
        moved: Output for the moved image (float32, the moving image's intensities), or None.
        warp_out: Output for the displacement field of the whole transform, or None.
        moving_seg: Moving label map file (rounded to integers), or None.
        fixed_seg: Fixed label map file (for Dice), or None.
        moved_seg: Output for the moved label map (unscaled integer type), or None.
        normalization: Intensity normalisation, see
            :func:`hyperreg.geometry.intensity.normalize_intensity`.
        resample: Resample inputs on other grids onto the fixed grid (default True).
        warp_format: ``"voxel"`` (default) or ``"itk"``.
        refine: Test-time refinement of the field for this pair
            (:func:`hyperreg.registration.refine.refine_pair`); 0 steps: the network's field as
            it is; None (default): the model's default
            (:func:`hyperreg.apps.models.pair_refinement`: a bundled model's card may ask for
            some steps, any other model runs none); a
            :class:`~hyperreg.apps.models.DefaultSteps`: those steps with its settings.
        inverse_warp_out: Output for the inverse displacement field (``exp(−v)``, same grid,
            affine and ``warp_format`` as ``warp_out``), or None. Needs a diffeomorphic model
            and ``init="none"``.
        init: ``"affine"`` (default), ``"rigid"`` or ``"none"``: the affine stage.
        affine_out: Output ITK transform file (``.mat``, ``.tfm`` or ``.txt``) of that stage,
            or None.
        field_out: Output for the deformable displacement field alone (``warp_format``), or
            None; with ``affine_out`` it is the same transform as ``warp_out``.
        initial_affine: An initial transform or ITK ``.mat``/``.tfm`` file: the affine stage
            starts from it, or with ``init="none"`` it is used as is
            (:func:`~hyperreg.registration.pipeline.load_pair`); None by default.
        npz_geometry: Geometry of npz inputs (no header): ``"fixed"``, ``"identity"`` or None
            (an npz input is an error), see :func:`hyperreg.registration.inputs.load_input`.
        figure: Output PNG of the alignment check
            (:func:`hyperreg.figures.alignment.alignment_figure`: before and after rows with the
            fixed image's edges, a checkerboard, the difference, and label borders when both
            label maps are given), or None.
        passes: Network passes, composed (:func:`hyperreg.registration.passes.register_passes`;
            ``refine`` refines the last); None (default): the model's own
            (``model.config.passes``).
        bias_correct: Remove each image's bias field (N4) before the affine stage and the
            network (:func:`hyperreg.registration.pipeline.model_image`); outputs are still
            sampled from the files as read.
        never_worse: When the registration lowered the model's similarity, write the better
            of the affine alone and the pair as it came instead (default True; the result's
            ``verdict`` says which, and a warning names the pair); False writes the
            registration and only flags it
            (:meth:`~hyperreg.registration.pipeline.PreparedPair.register`).
        replace_nonfinite: The value NaN/inf voxels of the images take (logged with their
            count; label maps must be finite); None (default): such an image is an error.
        fixed_mask, moving_mask: Cost masks (0/1 files; ANTs' ``-x``), or None: see
            :func:`~hyperreg.registration.pipeline.load_pair`.

    Returns:
        The :class:`~hyperreg.registration.pipeline.PairResult` (``resampled`` lists what was
        resampled; ``affine`` and ``refinement`` hold those stages' statistics).

    Raises:
        FileNotFoundError: If an input is missing.
        ValueError: If an input is unreadable or invalid (4D series, non-finite voxels, grids
            that differ with ``resample=False``, a model of another dimensionality),
            ``moved_seg`` is asked for without ``moving_seg``, an output path is unusable or
            its suffix wrong, the ITK format cannot represent a 2D fixed grid, ``lam`` is out
            of range, NaN or a word other than ``"auto"`` (``InputError``, argument ``lam``),
            ``refine`` is invalid, ``inverse_warp_out`` is asked of a model without a
            velocity field or with an affine stage, ``init`` is unknown, or the affine stage
            fails (images that do not overlap in world space, a diverging registration).
    """
    fn = "register_files"
    check_lambda(fn, lam)
    if moved_seg is not None and moving_seg is None:
        raise InputError(fn, "{0} needs {1} (the label map to warp)", "moved_seg", "moving_seg")
    check_option(fn, "warp_format", warp_format, DISPLACEMENT_FORMATS)
    outputs = dict(
        moved=moved,
        warp_out=warp_out,
        moved_seg=moved_seg,
        inverse_warp_out=inverse_warp_out,
        field_out=field_out,
    )
    check_outputs(fn, (moving, fixed, moving_seg, fixed_seg), **outputs)
    check_transform_path(fn, "affine_out", affine_out)
    if figure is not None and not str(figure).lower().endswith(".png"):
        raise InputError(fn, "{0} must end in .png, got '{figure}'", "figure", figure=figure)
    if inverse_warp_out is not None:
        _check_inverse(fn, model, init, initial_affine)
    if isinstance(refine, Refinement):
        check_refinement(fn, refine)
    refine = pair_refinement(model, refine)
    pair = _prepare(
        moving,
        fixed,
        itk_grid=(warp_out is not None or inverse_warp_out is not None) and warp_format == "itk",
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
    )
    chosen = pair_lambda(pair, model, lam)
    inverse = inverse_warp_out is not None
    result = pair.register(
        model, [chosen.lam], refine, inverse=inverse, passes=passes, never_worse=never_worse
    )[0]
    result.lam_reason = chosen.reason
    write_result(result, pair, **outputs, affine_out=affine_out, warp_format=warp_format)
    if figure is not None:
        alignment_png(figure, pair, result)
    return result


def _prepare(
    moving: PathLike,
    fixed: PathLike,
    *,
    itk_grid: bool,
    npz_geometry: str | None,
    replace_nonfinite: float | None,
    **options: Any,
) -> PreparedPair:
    """The pair of :func:`register_files`, each input read once (and warned about once): the
    fixed image first, so that an ITK field's grid is checked (``itk_grid``) before the affine
    stage, then :func:`~hyperreg.registration.pipeline.load_pair` with the other options."""
    read = dict(npz_geometry=npz_geometry, replace_nonfinite=replace_nonfinite)
    with passed_as(path="fixed"):  # a constant image: load_pair refuses it (no warning first)
        fixed_v = load_input(fixed, warn_constant=False, **read)
    if itk_grid:
        check_itk_grid(fixed_v)
    return load_pair(moving, fixed_v, **read, **options)


def _check_inverse(
    fn: str, model: HyperMorph, init: str, initial_affine: AffineTransform | PathLike | None
) -> None:
    """An inverse field is asked for: the transform must be the field alone (no affine stage,
    no initial affine) and the model must integrate a velocity field."""
    if initial_affine is not None:
        raise InputError(
            fn,
            "{0} inverts only the deformable field; with {1} the transform also holds that "
            "affine: resample the moving image through it first (e.g. 'hyperreg affine'), then "
            "register the result with {2} 'none' and without {1}",
            "inverse_warp_out",
            "initial_affine",
            "init",
        )
    if init != "none":
        raise InputError(
            fn,
            "{0} inverts only the deformable field; with {1} {init!r} the transform also holds "
            "an affine: use {1} 'none' (for a pair that is already aligned, e.g. by 'hyperreg "
            "affine')",
            "inverse_warp_out",
            "init",
            init=init,
        )
    if model.config.int_steps == 0:
        raise InputError(
            fn,
            "{0} needs a model with a velocity field; this is a model without a velocity field "
            "(int_steps 0), whose displacement has no exact inverse",
            "inverse_warp_out",
        )


def alignment_png(path: PathLike, pair: PreparedPair, result: PairResult) -> None:
    """Write the alignment check of one registration (``register --figure``) with
    :func:`hyperreg.figures.alignment.alignment_figure`: the moving image on the fixed grid (after
    the affine stage when one ran; the panel says which) and the moved image against the fixed
    image, all scaled to [0, 1] with the moving image's window of the default normalisation (the
    fixed with its own; :func:`~hyperreg.geometry.intensity.normalize_intensity`), so that a
    few outlying voxels do not darken the panels."""
    import numpy as np

    from hyperreg.figures.alignment import alignment_figure
    from hyperreg.geometry.intensity import intensity_window, normalize_intensity
    from hyperreg.registration.chain import sample_volume

    raw = pair.aligned.data
    low, high = intensity_window(raw)
    spread = high - low if high > low else 1.0
    moving_seg = pair.aligned_seg.data if pair.aligned_seg is not None else None
    if pair.chained and pair.moving_seg is not None:
        moving_seg = sample_volume(pair.moving_seg, pair.transform, None, pair.fixed, label=True)
        moving_seg = moving_seg.data
    paths = [Path(str(v.path)) for v in (pair.moving, pair.fixed)]
    names = [p.name for p in paths]
    if names[0] == names[1]:  # e.g. two FreeSurfer norm.mgz: the folders tell them apart
        names = [f"{p.parent.name}/{p.name}" for p in paths]
    alignment_figure(
        path,
        normalize_intensity(pair.fixed.data),
        np.clip((result.moved - low) / spread, 0.0, 1.0),
        pair.fixed.affine,
        moving=np.clip((raw - low) / spread, 0.0, 1.0),
        moving_title=(
            "moving (after the affine stage)"
            if pair.chained
            else "moving (on the fixed grid, through the headers)"
        ),
        fixed_seg=pair.fixed_seg.data if pair.fixed_seg is not None else None,
        moved_seg=result.moved_seg,
        moving_seg=moving_seg,
        title=f"{names[0]} to {names[1]} at λ = {result.lam:.3g}",
        difference_label="|difference| (intensities scaled to [0, 1])",
    )


def write_result(
    result: PairResult,
    pair: PreparedPair,
    *,
    moved: PathLike | None = None,
    warp_out: PathLike | None = None,
    moved_seg: PathLike | None = None,
    inverse_warp_out: PathLike | None = None,
    field_out: PathLike | None = None,
    affine_out: PathLike | None = None,
    warp_format: str = "voxel",
) -> None:
    """Write the outputs of one registration that are given, each atomically, on the fixed
    grid with its affine and layout (see :func:`register_files` for their contents).

    The files are written side by side, one thread per core: gzip compression of a 3D field
    dominates the writing and zlib releases the GIL while it compresses. The first error is
    raised after every write has ended."""
    fixed = pair.fixed
    jobs: list[Callable[[], object]] = []
    if moved is not None:
        jobs.append(partial(save_volume, moved, result.moved, fixed))
    if warp_out is not None:
        jobs.append(partial(save_displacement, warp_out, result.warp, fixed, format=warp_format))
    if field_out is not None:
        jobs.append(partial(save_displacement, field_out, result.disp, fixed, format=warp_format))
    if affine_out is not None:  # the identity when the pair as it came was kept
        headers = result.verdict is not None and result.verdict.kept == "headers"
        transform = AffineTransform.identity() if headers else pair.transform
        jobs.append(partial(save_affine, affine_out, transform, fixed.ndim))
    if inverse_warp_out is not None and result.inverse_disp is not None:
        inverse = partial(save_displacement, inverse_warp_out, result.inverse_disp, fixed)
        jobs.append(partial(inverse, format=warp_format))
    if moved_seg is not None and result.moved_seg is not None:
        jobs.append(partial(save_volume, moved_seg, result.moved_seg, fixed, label=True))
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        for job in jobs:
            job()
        return
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(job) for job in jobs]
    for future in futures:
        future.result()  # re-raises the first failure
