"""Register scan pairs with a trained model at a chosen λ, and apply or inspect saved fields.

:func:`register_files` registers files: on top of
:func:`hyperreg.registration.lambdas.register_pair` (loaded volumes in, numpy out) it loads and
validates every input first, registers, and only then writes the outputs (each atomically), so
bad input never leaves half-written files. Registration is voxel-to-voxel on the fixed grid: a
moving image (or label map) on another grid is first resampled onto it through both affines
(:func:`hyperreg.geometry.resample.resample_to`), unless resampling is turned off, in which case
differing grids are an error. Applying or inspecting a saved field afterwards is
:mod:`hyperreg.apps.transforms`. Must not import train or cli.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from hyperreg._checks import check_option
from hyperreg._errors import InputError, passed_as
from hyperreg.apps.inputs import read_label_map
from hyperreg.apps.models import DefaultSteps, check_lambda, pair_lambda, pair_refinement
from hyperreg.apps.outputs import OutputSpec, write_outputs
from hyperreg.geometry.affine import AffineTransform
from hyperreg.geometry.fields import check_itk_grid
from hyperreg.method.model import HyperMorph
from hyperreg.registration.contrast import (
    CONTRAST_CHOICES,
    contrast_lambda,
    contrast_similarity,
)
from hyperreg.registration.inputs import load_input
from hyperreg.registration.pairs import PathLike
from hyperreg.registration.pipeline import (
    DEFAULT_INIT,
    DEFAULT_NORMALIZATION,
    PairResult,
    PreparedPair,
    load_pair,
)
from hyperreg.registration.refine import Refinement, check_refinement
from hyperreg.registration.settings import resolve_settings

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
    contrast: str = "auto",
    fixed_mask: PathLike | None = None,
    moving_mask: PathLike | None = None,
    outputs: OutputSpec | None = None,
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
        moving_seg: Moving label map file, or None. Read once and checked as it is read
            (:func:`~hyperreg.apps.inputs.read_label_map`: integer ids, at most
            :data:`~hyperreg.apps.inputs.MAX_LABELS` of them), before the images.
        fixed_seg: Fixed label map file (for Dice), or None; read and checked likewise.
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
        inverse_warp_out: Output for the inverse of the whole transform (affine stage and field,
            :meth:`~hyperreg.registration.transform_chain.TransformChain.inverse`), in
            ``warp_format``, or None: defined on the moving image's grid (its affine), so that
            warping the fixed image with it lands on the moving image (on the fixed grid when
            the pair needs no chain). Needs a diffeomorphic model.
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
        contrast: ``"auto"`` (default): after the affine stage, pairs whose intensities do
            not correspond (a T2 or FLAIR to a T1;
            :func:`hyperreg.registration.contrast.compare_contrasts`) are registered as other
            contrasts, said in one INFO line: the network and refinement see the moving image
            drawn in the fixed image's intensities, the verdict uses normalised gradient fields
            (a field must raise them by :data:`~hyperreg.registration.verdict.MIN_GAINS` to be
            kept) and a model's default λ below 0.2 is raised to 0.2; ``"same"``: the images
            as read, the model's similarity (local NCC); ``"different"``: as other contrasts
            without asking. ``refine`` is used as given (its own similarity).
        fixed_mask, moving_mask: Cost masks (0/1 files; ANTs' ``-x``), or None: see
            :func:`~hyperreg.registration.pipeline.load_pair`.
        outputs: Every output path and the warp format as one
            :class:`~hyperreg.apps.outputs.OutputSpec` (what the command line passes), instead
            of ``moved`` ... ``field_out`` and ``warp_format``; None: those keywords.

    Returns:
        The :class:`~hyperreg.registration.pipeline.PairResult` (``resampled`` lists what was
        resampled; ``affine`` and ``refinement`` hold those stages' statistics).

    Raises:
        FileNotFoundError: If an input is missing.
        ValueError: If an input is unreadable or invalid (4D series, non-finite voxels, a
            label map that holds intensities rather than integer ids, grids
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
    check_option(fn, "contrast", contrast, CONTRAST_CHOICES)
    spec = _spec(
        fn, outputs, moved=moved, warp_out=warp_out, moved_seg=moved_seg,
        inverse_warp_out=inverse_warp_out, affine_out=affine_out, field_out=field_out,
        warp_format=warp_format,
    )  # fmt: skip
    _check_outputs(fn, (moving, fixed, moving_seg, fixed_seg), spec, figure)
    inverse = spec.inverse_warp_out is not None
    if inverse:
        _check_inverse(fn, model)
    if isinstance(refine, Refinement):
        check_refinement(fn, refine)
    refine = pair_refinement(model, refine)
    # the options, checked before the affine stage (λ is chosen for the pair after it)
    resolve_settings(model, [0.0], refine, passes=passes, inverse=inverse, fn=fn)
    pair = _prepare(
        moving,
        fixed,
        itk_grid=spec.warp_format == "itk" and bool(spec.warp_out or spec.inverse_warp_out),
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
    similarity = contrast_similarity(pair, contrast)
    chosen = pair_lambda(pair, model, lam)
    if lam is None and (raised := contrast_lambda(chosen.lam, similarity)) is not None:
        reason = f"{chosen.reason}, raised to {raised:g} for other contrasts"
        chosen = dataclasses.replace(chosen, lam=raised, reason=reason)
    result = pair.register(
        model, [chosen.lam], refine, inverse=inverse, passes=passes, never_worse=never_worse,
        lambda_source=chosen.reason, similarity=similarity,
    )[0]  # fmt: skip
    result.lam_reason = chosen.reason
    write_outputs(spec, result, pair)
    if figure is not None:
        alignment_png(figure, pair, result)
    return result


def _spec(fn: str, outputs: OutputSpec | None, **keywords: Any) -> OutputSpec:
    """``outputs``, or the :class:`~hyperreg.apps.outputs.OutputSpec` of the output keywords of
    :func:`register_files`; both given is an InputError (``outputs``)."""
    spec = OutputSpec(**keywords)
    if outputs is None:
        return spec
    if spec != OutputSpec():
        message = "{0} holds every output: give it or the output keywords, not both"
        raise InputError(fn, message, "outputs")
    return outputs


def _check_outputs(
    fn: str, inputs: tuple[PathLike | None, ...], spec: OutputSpec, figure: PathLike | None
) -> None:
    """Check the outputs of a register call: a moved label map needs the moving one (``inputs``
    are moving, fixed, moving_seg, fixed_seg); :meth:`~hyperreg.apps.outputs.OutputSpec.check`
    (a known warp format, outputs that overwrite no input, a transform file's suffix); the
    figure is a ``.png``."""
    if spec.moved_seg is not None and inputs[2] is None:
        raise InputError(fn, "{0} needs {1} (the label map to warp)", "moved_seg", "moving_seg")
    spec.check(fn, inputs)
    if figure is not None and not str(figure).lower().endswith(".png"):
        raise InputError(fn, "{0} must end in .png, got '{figure}'", "figure", figure=figure)


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
    label maps first, checked as they are read (:func:`~hyperreg.apps.inputs.read_label_map`:
    integer ids, not an intensity image), then the fixed image, so that an ITK field's grid is
    checked (``itk_grid``) before the affine stage, then
    :func:`~hyperreg.registration.pipeline.load_pair` with the other options."""
    for name in ("moving_seg", "fixed_seg"):
        if isinstance(path := options.get(name), (str, os.PathLike)):
            options[name] = read_label_map("register_files", name, path)
    read = dict(npz_geometry=npz_geometry, replace_nonfinite=replace_nonfinite)
    with passed_as(path="fixed"):  # a constant image: load_pair refuses it (no warning first)
        fixed_v = load_input(fixed, warn_constant=False, **read)
    if itk_grid:
        check_itk_grid(fixed_v)
    return load_pair(moving, fixed_v, **read, **options)


def _check_inverse(fn: str, model: HyperMorph) -> None:
    """An inverse field is asked for: the model must integrate a velocity field (the affine
    stage, or an initial affine, is inverted with the field as one chain)."""
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
    image, all scaled to [0, 1] with the window of the default normalisation of the moving image
    as read (the moved image's units; the fixed with its own;
    :func:`~hyperreg.geometry.intensity.normalize_intensity`), so that a few outlying voxels do
    not darken the panels. When nothing of the moving image reaches the fixed grid before the
    field (e.g. 2D slices in different world planes) the "before" row is left out and the title
    says why: the figure shows the images on the fixed grid, as the moved image is."""
    import numpy as np

    from hyperreg.figures.alignment import alignment_figure
    from hyperreg.geometry.intensity import intensity_window, normalize_intensity

    raw = pair.aligned.data
    low, high = intensity_window(pair.moving.data)
    spread = high - low if high > low else 1.0
    reaches = bool(np.any(raw != 0)) or not np.any(result.moved != 0)
    moving_seg = pair.aligned_seg.data if pair.aligned_seg is not None else None
    if pair.chained and pair.moving_seg is not None:
        moving_seg = pair.chain().apply(pair.moving_seg, label=True).data
    paths = [Path(str(v.path)) for v in (pair.moving, pair.fixed)]
    names = [p.name for p in paths]
    if names[0] == names[1]:  # e.g. two FreeSurfer norm.mgz: the folders tell them apart
        names = [f"{p.parent.name}/{p.name}" for p in paths]
    alignment_figure(
        path,
        normalize_intensity(pair.fixed.data),
        np.clip((result.moved - low) / spread, 0.0, 1.0),
        pair.fixed.affine,
        moving=np.clip((raw - low) / spread, 0.0, 1.0) if reaches else None,
        moving_title=(
            "moving (after the affine stage)"
            if pair.chained
            else "moving (on the fixed grid, through the headers)"
        ),
        fixed_seg=pair.fixed_seg.data if pair.fixed_seg is not None else None,
        moved_seg=result.moved_seg,
        moving_seg=moving_seg if reaches else None,
        title=f"{names[0]} to {names[1]} at λ = {result.lam:.3g}"
        + ("" if reaches else " (no 'before' row: the moving image does not reach the fixed grid)"),
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
    """Write the outputs of one registration that are given, each atomically (see
    :func:`register_files` for their contents): :func:`hyperreg.apps.outputs.write_outputs`
    through the :class:`~hyperreg.apps.outputs.OutputSpec` of these keywords."""
    spec = OutputSpec(
        moved=moved,
        warp_out=warp_out,
        moved_seg=moved_seg,
        inverse_warp_out=inverse_warp_out,
        field_out=field_out,
        affine_out=affine_out,
        warp_format=warp_format,
    )
    write_outputs(spec, result, pair)
