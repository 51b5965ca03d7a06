"""One pair from its files to its outputs: the registration pipeline every command runs.

:func:`load_pair` reads a pair once, checks it (dimensions first, before any expensive stage),
runs the affine stage once (or takes an initial affine), brings the label maps and baselines
onto the fixed grid and returns a :class:`PreparedPair` (defined in
:mod:`hyperreg.registration.prepared`, re-exported here). :meth:`PreparedPair.register` then
registers it at one or many λ (with the model's network passes,
:mod:`hyperreg.registration.passes`, optionally refined for the pair) and returns one typed
:class:`PairResult` per λ whose outputs already went through the whole chain (affine, then the
deformable field): the moved image and label map are sampled **once** from the original files
(:func:`hyperreg.registration.chain.sample_volume`), ``warp`` is the composed field, and Dice
follows :func:`hyperreg.method.metrics.registration_dice` (labels of the inputs, an erased
label scores 0). ``register``, ``sweep``, ``tune`` and ``batch`` (:mod:`hyperreg.apps`) are
shells around these two calls that write files and reports. Must not import training, apps or
cli.

An initial transform (``initial_affine``, a transform or an ITK file) starts the affine stage
or replaces it; λ chosen per pair without labels is
:func:`hyperreg.registration.autolambda.auto_lambda` of a :class:`PreparedPair`.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import numpy as np

from hyperreg._checks import check_option
from hyperreg._errors import InputError, passed_as
from hyperreg.geometry.affine import (
    AFFINE_INITS,
    AffineTransform,
    register_affine,
    resample_affine,
)
from hyperreg.geometry.bias import correct_bias
from hyperreg.geometry.inspect import check_pair_contents, label_grid_warning
from hyperreg.geometry.inspect import label_ids_warning, spacing_warning
from hyperreg.geometry.intensity import DEFAULT_NORMALIZATION, winsorize
from hyperreg.geometry.intensity_map import intensity_map
from hyperreg.geometry.io import Volume, check_same_grid, check_same_ndim, same_grid
from hyperreg.geometry.resample import isotropic_grid, resample_to
from hyperreg.method.metrics import mean_registration_dice
from hyperreg.method.model import HyperMorph
from hyperreg.registration.baseline import PairBaseline, beside, pair_baseline
from hyperreg.registration.chain import sample_volume
from hyperreg.registration.inputs import (
    NPZ_GEOMETRIES,
    check_registrable,
    initial_transform,
    load_input,
)
from hyperreg.registration.masks import FOV_PARTIAL, cut_view, field_of_view, filled_view
from hyperreg.registration.masks import load_masks, masked_image, moving_footprint
from hyperreg.registration.pairs import PathLike, onto_fixed_grid
from hyperreg.registration.prepared import PreparedPair, ndim_error
from hyperreg.registration.results import AffineStage, PairResult, RefineStats
from hyperreg.registration.verdict import MIN_FIELD_OF_VIEW

__all__ = [
    "DEFAULT_INIT",
    "DEFAULT_NORMALIZATION",
    "NPZ_GEOMETRIES",
    "AffineStage",
    "InputError",
    "PairResult",
    "PreparedPair",
    "RefineStats",
    "initial_transform",
    "load_input",
    "load_pair",
    "model_image",
]

DEFAULT_INIT = "affine"
"""The affine stage every entry point runs unless told otherwise (Python and CLI alike)."""
JUDGE_VOXELS = 2_000_000
"""Above this many fixed voxels the contrast check before the affine stage's rerun for other
contrasts (:func:`_affine_other_contrast`) runs on a grid of 2 mm voxels."""


def load_pair(
    moving: PathLike | Volume,
    fixed: PathLike | Volume,
    *,
    model: HyperMorph | None = None,
    moving_seg: PathLike | Volume | None = None,
    fixed_seg: PathLike | Volume | None = None,
    init: str = DEFAULT_INIT,
    initial_affine: AffineTransform | PathLike | None = None,
    normalization: str = DEFAULT_NORMALIZATION,
    resample: bool = True,
    seed: int = 0,
    npz_geometry: str | None = None,
    bias_correct: bool = False,
    replace_nonfinite: float | None = None,
    fixed_mask: PathLike | Volume | None = None,
    moving_mask: PathLike | Volume | None = None,
    contrast: str = "same",
) -> PreparedPair:
    """Read and check a pair once, run its affine stage once: a :class:`PreparedPair`.

    Checks come before any expensive stage: the dimensionality of both images (and of
    ``model``, when given) first, then whether the pair can be registered at all
    (:func:`~hyperreg.registration.inputs.check_registrable`: errors), then what the images
    hold (warnings), then the grids (``resample=False``), then the affine stage.

    Args:
        moving: Moving image (file or :class:`~hyperreg.geometry.io.Volume`), any grid.
        fixed: Fixed image; every output is on its grid.
        model: The model that will register the pair (only its ``ndim`` is checked), or None.
        moving_seg: Moving label map (integer ids), or None.
        fixed_seg: Fixed label map, or None; Dice needs both.
        init: ``"affine"`` (default), ``"rigid"`` or ``"none"``: the affine stage
            (:func:`hyperreg.geometry.affine.register_affine`).
        initial_affine: An initial transform (fixed world -> moving world, RAS mm): an
            :class:`~hyperreg.geometry.affine.AffineTransform`, or an ITK ``.mat``/``.tfm`` file
            (ANTs', SimpleITK's, or an earlier ``--affine-out``; read and checked against the
            pair by :func:`~hyperreg.geometry.affine.load_initial_affine`). With
            ``init="none"`` it is used as is; otherwise the affine stage starts from it and
            refines it (ANTs' ``--initial-moving-transform``).
        normalization: Intensity normalisation of what the affine stage registers and the
            network sees (:func:`model_image`; ``"robust"``, the default, ``"minmax"`` or
            ``"none"``). The outputs are sampled from the files as read, in their own units.
        resample: Resample inputs on other grids onto the fixed grid (default True); False
            makes differing grids an error.
        seed: Seed of the affine stage's metric sampling.
        npz_geometry: Geometry of header-less (npz) inputs: ``"fixed"`` (the fixed image's;
            shapes must agree), ``"identity"`` (1 mm voxels, world = voxel index), or None
            (default): an npz input is an error (:func:`load_input`).
        bias_correct: Remove each image's bias field (N4) before the affine stage and the
            network (:func:`model_image`); outputs are still sampled from the files as read.
        replace_nonfinite: The value NaN/inf voxels of ``moving`` and ``fixed`` take (logged
            with their count); None (default): such an image is an error.
        fixed_mask, moving_mask: Cost masks (files or Volumes holding 0 and 1; ANTs' ``-x``),
            or None: the affine stage's metric counts only voxels inside them; the network
            sees a hole enclosed by a mask filled from the tissue around it and the rest
            outside as background (:func:`~hyperreg.registration.masks.masked_image`). A
            moving image covering under 90 % of the fixed head runs the affine stage again on
            the covered part (:func:`_affine_in_view`). A mask on another grid than its image
            is resampled onto it through the headers (nearest; a note),
            :func:`~hyperreg.registration.masks.load_mask`. Kept on the result
            (``fixed_mask``, ``moving_mask``).
        contrast: ``"same"`` (default): one affine stage. ``"auto"`` or ``"different"``:
            when the pair shows other contrasts after it
            (:func:`~hyperreg.registration.contrast.pair_similarity`), the affine stage runs
            again from the start on the moving image drawn in the fixed image's intensities
            (:func:`_affine_other_contrast`).

    Returns:
        A :class:`PreparedPair` whose ``fixed`` and ``aligned`` hold the intensities the
        network sees and whose ``moving`` is the moving image as read.

    Warns:
        UserWarning: Before the affine stage, for a label map
            given as ``moving`` or ``fixed``, a head with skull against a skull-stripped image
            (:func:`hyperreg.geometry.inspect.check_pair_contents`), and, with ``model``, an
            image whose voxels are much coarser than the model's voxel size
            (:func:`hyperreg.geometry.inspect.spacing_warning`). One line each.

    Raises:
        FileNotFoundError: If an input is missing.
        InputError: On 2D with 3D (the images, or a label map and its image), a model of
            another dimensionality (``argument`` "model"), a bad ``initial_affine`` file (not
            an affine of the pair's dimensionality, or off the fixed view; ``argument``
            "initial_affine"), a bad mask (values other than 0 and 1, empty, or not
            overlapping its image; ``argument`` "fixed_mask" or "moving_mask"), an unknown
            ``init``, an npz input without ``npz_geometry``
            (``argument`` "npz_geometry"), an empty or constant image (``argument`` "moving"
            or "fixed"), or, with ``init="none"`` and no ``initial_affine``, images that do
            not overlap in world space (``argument`` "init"; the moved image would be empty).
        ValueError: On unreadable inputs, differing grids with ``resample=False``, or a failed
            affine stage.
    """
    fn = "load_pair"
    check_option(fn, "init", init, AFFINE_INITS)
    read = dict(npz_geometry=npz_geometry, replace_nonfinite=replace_nonfinite)
    with passed_as(path="fixed"):  # a constant image is refused below, not warned about
        fixed_v = load_input(fixed, warn_constant=False, **read)
    geometry = dict(read, fixed=fixed_v)
    with passed_as(path="moving"):
        moving_v = load_input(moving, warn_constant=False, **geometry)
    check_same_ndim(fn, moving_v, fixed_v)
    if model is not None and model.config.ndim != fixed_v.ndim:
        raise ndim_error(fn, model, fixed_v)
    initial = initial_transform(initial_affine, moving_v, fixed_v)
    check_registrable(fn, moving_v, fixed_v, init=init, initial=initial)
    _warn_about_contents(moving_v, fixed_v, model)
    segs = {"moving_seg": moving_seg, "fixed_seg": fixed_seg}
    for name, seg in segs.items():
        with passed_as(path=name):  # a label map's errors name the argument that gave it
            segs[name] = None if seg is None else load_input(seg, label=True, **geometry)
    for name, image in (("moving_seg", moving_v), ("fixed_seg", fixed_v)):
        if segs[name] is not None:  # a label map of another dimensionality than its image
            with passed_as(moving=name):
                check_same_ndim(fn, segs[name], image)
            if (note := label_grid_warning(segs[name], image)) is not None:
                warnings.warn(note, stacklevel=2)
    moving_seg_v, fixed_seg_v = segs.values()
    masks, mask_notes = load_masks(fn, (moving_mask, moving_v), (fixed_mask, fixed_v))
    if not resample:
        check_same_grid(moving_v, fixed_v)
    # the affine stage and the network see the same intensities (one rule, after the optional
    # bias correction); the outputs are sampled from the volumes as read
    seen = [model_image(masked_image(v, m), normalization, bias_correct) for v, m in masks]
    metric_masks = dict(moving_mask=masks[0][1], fixed_mask=masks[1][1])
    stage = (seen, (moving_v, fixed_v), init, seed, initial, contrast, metric_masks)
    # what does not depend on the affine result is made beside it (a second CPU thread)
    baseline = (seen[1], moving_seg_v, fixed_seg_v)
    (transform, affine, again, chained), base = beside(
        functools.partial(_affine_result, *stage), functools.partial(pair_baseline, *baseline)
    )
    if seen[0] is not moving_v:  # outputs from the moving file as read, not the model's copy
        chained = True
    pair = _prepared(
        *seen,
        moving_seg_v,
        fixed_seg_v,
        transform,
        chained,
        affine,
        normalization,
        resample,
        base,
    )
    if seen[0] is not moving_v:
        pair.moving = moving_v
    _with_masks(pair, metric_masks, mask_notes, moving_v, fixed_v)
    pair.notes.extend(again)
    if bias_correct:
        pair.notes.append("bias field corrected (N4) for the affine stage and the network")
    return pair


def _affine_result(
    seen: list[Volume],
    read: tuple[Volume, Volume],
    init: str,
    seed: int,
    initial: AffineTransform | None,
    contrast: str,
    masks: dict,
) -> tuple[AffineTransform, AffineStage | None, list[str], bool]:
    """The transform of :func:`load_pair` (its affine stages, or ``initial`` as is with
    ``init="none"``), its statistics, its notes, and whether outputs go through it
    (``chained``: it is not the identity, or the images as ``read`` are on other grids)."""
    if initial is not None and init == "none":
        transform, affine, again = initial, AffineStage.of(initial, "initial"), []
        return transform, affine, again, not _is_identity(transform, *read)
    # other contrasts and a cut field of view run again (see each)
    transform, again = _affine_stages(seen, init, seed, initial, contrast, masks)
    affine = AffineStage.of(transform) if init != "none" else None
    chained = init != "none" and not _is_identity(transform, *read)
    return transform, affine, again, chained


def _affine_stages(
    seen: list[Volume],
    init: str,
    seed: int,
    initial: AffineTransform | None,
    contrast: str,
    masks: dict,
) -> tuple[AffineTransform, list[str]]:
    """The affine stage of ``seen`` (the model's moving and fixed images) with its cost
    ``masks``, run again for other contrasts (:func:`_affine_other_contrast`) and for a cut
    field of view (:func:`_affine_in_view`): the transform, and a note when the first rerun
    ran."""
    transform = register_affine(*seen, init, seed=seed, initial=initial, **masks)
    drawn, transform = _affine_other_contrast(seen, transform, init, initial, contrast, seed, masks)
    transform = _affine_in_view(drawn, transform, init, seed, initial, masks)
    if drawn is seen:
        return transform, []
    note = (
        "other contrasts: the affine stage ran again on the moving image drawn in the fixed "
        "image's intensities (its Mattes MI is that image's)"
    )
    return transform, [note]


def _affine_other_contrast(
    seen: list[Volume],
    transform: AffineTransform,
    init: str,
    initial: AffineTransform | None,
    contrast: str,
    seed: int,
    masks: dict,
) -> tuple[list[Volume], AffineTransform]:
    """The affine stage of a pair of other contrasts (``contrast`` ``"different"``, or
    ``"auto"`` and :func:`~hyperreg.registration.contrast.pair_similarity` finds them on the
    moving image through ``transform``): run again from the start on the moving image drawn in
    the fixed image's intensities (:func:`~hyperreg.geometry.intensity_map.intensity_map`
    found through ``transform``), with the same cost ``masks``. Returns the images the affine
    stage then registers (the drawn moving image, the fixed one) and the transform (seconds:
    both runs'); ``seen`` and ``transform`` themselves for the same contrast, without an affine
    stage (``init`` "none") or from an initial transform."""
    from hyperreg.registration.contrast import OTHER_SIMILARITY, pair_similarity

    if contrast == "same" or init == "none" or initial is not None:
        return seen, transform
    moving, fixed = seen
    grid = fixed  # judged on a grid of 2 mm voxels or larger when the image is large
    if fixed.data.size > JUDGE_VOXELS and (coarse := isotropic_grid(fixed, 2.0)) is not None:
        grid = dataclasses.replace(coarse, data=resample_to(fixed, coarse).data)
    aligned = sample_volume(moving, transform, None, grid).data
    if pair_similarity(contrast, aligned, grid.data)[0] != OTHER_SIMILARITY:
        return seen, transform
    drawn = dataclasses.replace(moving, data=intensity_map(aligned, grid.data).apply(moving.data))
    again = register_affine(drawn, fixed, init, seed=seed, **masks)
    return [drawn, fixed], dataclasses.replace(again, seconds=again.seconds + transform.seconds)


def _affine_in_view(
    seen: list[Volume],
    transform: AffineTransform,
    init: str,
    seed: int,
    initial: AffineTransform | None,
    masks: dict,
) -> AffineTransform:
    """The affine stage of a pair whose moving image covers less than :data:`FOV_PARTIAL` of
    the fixed head through ``transform`` (:func:`~hyperreg.registration.masks.field_of_view`,
    a cut field of view), run again with the fixed image's cost mask cut to the moving
    array's footprint through ``transform``: its centre of mass, orientation search and
    metric then see the part of the fixed head the moving scan holds (the first run's start
    from the whole head's centre of mass misplaces a cut head). ``transform`` itself for any
    other pair, and without an affine stage (``init`` "none"). The seconds are both runs'."""
    moving, fixed = seen
    if init == "none" or field_of_view(moving, fixed, transform) >= FOV_PARTIAL:
        return transform
    inside = moving_footprint(fixed, moving, transform, True)
    if masks["fixed_mask"] is not None:
        inside &= np.asarray(masks["fixed_mask"].data, dtype=bool)
    if inside.sum() < 0.01 * inside.size:  # next to no overlap: nothing to run again on
        return transform
    cut = dict(masks, fixed_mask=dataclasses.replace(fixed, data=inside))
    again = register_affine(moving, fixed, init, seed=seed, initial=initial, **cut)
    return dataclasses.replace(again, seconds=again.seconds + transform.seconds)


def model_image(
    volume: Volume, normalization: str = DEFAULT_NORMALIZATION, bias_correct: bool = False
) -> Volume:
    """``volume`` as the affine stage and the network see it, same grid and path: its bias
    field removed (:func:`~hyperreg.geometry.bias.correct_bias`) when ``bias_correct``, then
    its outlying voxels (:func:`~hyperreg.geometry.intensity.winsorize` with
    ``normalization``); ``volume`` itself when neither changes anything."""
    if bias_correct:
        volume = correct_bias(volume)
    data = winsorize(volume.data, normalization)
    if data is volume.data:
        return volume
    return dataclasses.replace(volume, data=data)


def _warn_about_contents(moving: Volume, fixed: Volume, model: HyperMorph | None) -> None:
    """Warn (one line each) about a label map given as an image, a head against a stripped
    brain (:func:`~hyperreg.geometry.inspect.check_pair_contents`) and voxels far from the
    model's (:func:`~hyperreg.geometry.inspect.spacing_warning`; coarser only, as the
    network grid resamples finer voxels to the model's): cheap, before the affine stage."""
    found = check_pair_contents(moving, fixed, model_skull_stripped=None)
    spacing = 0.0 if model is None else float(model.config.spacing)
    for role, volume in (("moving", moving), ("fixed", fixed)):
        # a model with a voxel size resamples every pair to it (network grid), so only voxels
        # coarser than the model's lose detail; finer ones are averaged down as in training
        if spacing > 0 and max(volume.spacing) > spacing:
            found.append(spacing_warning(volume, spacing, role=role) or "")
    for message in found:
        if message:
            warnings.warn(message, stacklevel=3)


def _with_masks(
    pair: PreparedPair, masks: dict, notes: list[str], moving: Volume, fixed: Volume
) -> None:
    """Give ``pair`` its cost masks and their notes, and its field-of-view share
    (:func:`~hyperreg.registration.masks.field_of_view`): below :data:`FOV_PARTIAL` without a
    moving mask, the moving image's array becomes its mask (refinement then counts only where
    both images have data), and beyond that array the network and refinement see the fixed
    image (:func:`~hyperreg.registration.masks.filled_view`, as ``pair.remapped``); below
    :data:`~hyperreg.registration.verdict.MIN_FIELD_OF_VIEW`, a one-line warning."""
    pair.moving_mask, pair.fixed_mask = masks["moving_mask"], masks["fixed_mask"]
    pair.notes.extend(notes)
    pair.fov_fraction = fraction = field_of_view(moving, fixed, pair.transform)
    inside = cut_view(pair)
    if inside is not None:  # the network sees a whole head: the fixed one where the moving is cut
        pair.remapped = filled_view(pair.aligned, pair.fixed, inside)
        pair.chained = True  # outputs from the file as read, never the filled copy
    if fraction < FOV_PARTIAL and pair.moving_mask is None:
        whole = np.ones(moving.spatial_shape, dtype=bool)
        pair.moving_mask = dataclasses.replace(moving, data=whole)
    if fraction < MIN_FIELD_OF_VIEW:
        warnings.warn(
            f"the moving image '{moving.path}' covers {100 * fraction:.0f} % of the fixed "
            "head after the affine stage (a partial field of view); the similarity counts "
            "only where both images have data",
            stacklevel=3,
        )


def _is_identity(transform: AffineTransform, moving: Volume, fixed: Volume) -> bool:
    """No affine to compose: the identity, and ``moving`` already on the fixed grid."""
    return bool(np.allclose(transform.matrix, np.eye(4), atol=1e-9)) and same_grid(moving, fixed)


def _prepared(
    moving: Volume,
    fixed: Volume,
    moving_seg: Volume | None,
    fixed_seg: Volume | None,
    transform: AffineTransform,
    chained: bool,
    affine: AffineStage | None,
    normalization: str,
    resample: bool,
    base: PairBaseline,
) -> PreparedPair:
    """The grids, label maps and baselines of a pair whose affine stage is done (``base``:
    what was made beside it, :func:`~hyperreg.registration.baseline.pair_baseline`)."""
    fn = "load_pair"
    (aligned, aligned_seg, fixed_seg), notes = onto_fixed_grid(
        fn,
        fixed,
        None if chained else moving,
        None if chained else moving_seg,
        fixed_seg,
        resample=resample,
    )
    if chained:
        aligned = resample_affine(moving, fixed, transform)
        # without an affine stage, chained only so that outputs come from the file as read
        # (load_pair: the network's copy was clipped or bias-corrected)
        through = f"the {affine.kind} stage and the field" if affine else "the field"
        notes.insert(
            0, f"moving '{moving.path}' sampled once through {through} onto the fixed grid"
        )
    assert aligned is not None
    labels, shared, dice_before, dice_affine = base.labels, base.shared, base.dice_before, None
    if moving_seg is not None and fixed_seg is not None:
        if (message := label_ids_warning(moving_seg, fixed_seg, labels, shared)) is not None:
            warnings.warn(message, stacklevel=4)
        if chained and affine is not None:
            alone = sample_volume(moving_seg, transform, None, fixed, label=True).data
            dice_affine = mean_registration_dice(alone, fixed_seg.data, labels=labels)
        elif affine is not None:  # the stage kept the identity on the fixed grid
            dice_affine = dice_before
    return PreparedPair(
        moving=moving,
        fixed=fixed,
        moving_seg=moving_seg,
        fixed_seg=fixed_seg,
        transform=transform,
        chained=chained,
        aligned=aligned,
        aligned_seg=aligned_seg,
        labels=labels,
        dice_before=dice_before,
        dice_affine=dice_affine,
        affine=affine,
        normalization=normalization,
        notes=notes,
        shared_labels=None if shared is None else list(shared),
    )
