"""One pair from its files to its outputs: the registration pipeline every command runs.

:func:`load_pair` reads a pair once, checks it (dimensions first, before any expensive stage),
runs the affine stage once (or takes an initial affine), brings the label maps and baselines
onto the fixed grid and returns a :class:`PreparedPair`. :meth:`PreparedPair.register` then
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
import contextlib
import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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
from hyperreg.geometry.io import Volume, check_same_grid, check_same_ndim, same_grid
from hyperreg.geometry.resample import resample_to
from hyperreg.method.metrics import label_sets, mean_registration_dice, registration_dice
from hyperreg.method.model import HyperMorph
from hyperreg.registration.chain import composed_displacement, sample_volume
from hyperreg.registration.inputs import (
    NPZ_GEOMETRIES,
    check_registrable,
    initial_transform,
    load_input,
)
from hyperreg.registration.lambdas import sweep_lambdas
from hyperreg.registration.pairs import (
    PathLike,
    RegistrationResult,
    onto_fixed_grid,
)
from hyperreg.registration.passes import register_passes
from hyperreg.registration.refine import Refinement, refine_objective, refine_pair
from hyperreg.registration.results import AffineStage, PairResult, RefineStats
from hyperreg.registration.similarity import network_input, network_similarity, on_fixed_grid
from hyperreg.registration.verdict import Verdict, decompose_affine, judge

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

logger = logging.getLogger(__name__)

DEFAULT_INIT = "affine"
"""The affine stage every entry point runs unless told otherwise (Python and CLI alike)."""


@dataclass
class PreparedPair:
    """A pair read once, after the affine stage, ready for :meth:`register` at any λ.

    Attributes:
        moving: The moving image as read (its own grid).
        fixed: The fixed image as the network sees it (:func:`model_image`: outlying voxels
            clipped, bias-corrected on request); every output is on its grid.
        moving_seg: The moving label map as read, or None.
        fixed_seg: The fixed label map on the fixed grid, or None.
        transform: Fixed world -> moving world affine (identity without an affine stage).
        chained: Outputs are sampled through ``transform`` and the field from the originals
            (also without an affine stage when the model's moving image differs from the file).
        aligned: The model's moving image (:func:`model_image`) on the fixed grid (through
            ``transform`` or the headers).
        aligned_seg: The moving label map on the fixed grid when not ``chained``, else None.
        labels: Label ids scored (the inputs' union), or None without both label maps.
        dice_before: Mean Dice with no registration, or None.
        dice_affine: Mean Dice of the affine alone (``chained`` only), or None.
        affine: The affine stage's statistics, or None.
        normalization: Intensity normalisation of the model inputs.
        notes: What was resampled onto which grid.
    """

    moving: Volume
    fixed: Volume
    moving_seg: Volume | None
    fixed_seg: Volume | None
    transform: AffineTransform
    chained: bool
    aligned: Volume
    aligned_seg: Volume | None
    labels: list[int] | None
    dice_before: float | None
    dice_affine: float | None
    affine: AffineStage | None
    normalization: str
    notes: list[str]
    _similarity: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def register(
        self,
        model: HyperMorph,
        lams: Sequence[float],
        refinement: Refinement | None = None,
        *,
        inverse: bool = False,
        chunk: int | None = None,
        amp: bool = False,
        ncc: bool = False,
        passes: int | None = None,
        never_worse: bool = True,
        judged: bool = True,
    ) -> list[PairResult]:
        """Register the pair at every λ of ``lams``; outputs through the chain.

        Without refinement (or with 0 steps) and without ``inverse`` every λ runs in batched
        forward passes (:func:`~hyperreg.registration.lambdas.sweep_lambdas`); otherwise each
        λ is refined for the pair (:func:`~hyperreg.registration.refine.refine_pair`).

        Every result carries a :class:`~hyperreg.registration.verdict.Verdict`: the model's
        similarity of the pair as it came, after the affine stage and registered (on the
        network grid, :func:`~hyperreg.registration.similarity.network_similarity`), the
        affine's scales and shears, and ``ok`` or ``check: <reason>``
        (:func:`~hyperreg.registration.verdict.judge`). With ``never_worse``, a registration
        less similar than the better of the other two beyond the margin is replaced by it
        (the identity field after the affine, or the pair as it came). A pair that needs
        checking is logged as one warning naming it (``'<moving>' -> '<fixed>' at λ <λ>:
        check: <reasons>``).

        Args:
            model: A trained :class:`~hyperreg.method.model.HyperMorph` of the pair's ndim.
            lams: λ values in [0, 1], in any order.
            refinement: Test-time refinement of each λ's field, or None.
            inverse: Also compute each field's inverse (a model with a velocity field, and a
                pair without an affine to compose).
            chunk, amp, ncc: See :func:`~hyperreg.registration.lambdas.sweep_lambdas`.
            passes: Network passes per λ, composed (:func:`~hyperreg.registration.passes.
                register_passes`; refinement refines the last); None (default): the model's
                own (``model.config.passes``, 1 unless it records more; 1 with ``inverse``).
            never_worse: Keep the better of the pair as it came and the affine alone when
                the registration lowered the similarity (default True); False keeps the
                registration and only flags it in the verdict.
            judged: Give each result its verdict (default True); False: no verdict (None)
                and no never-worse rule, the model's own fields as they are (a λ search
                scoring the model, which saves the similarity evaluations).

        Returns:
            One :class:`PairResult` per λ, in the order given.

        Raises:
            ValueError: As ``sweep_lambdas`` and ``refine_pair`` (λ out of range, a model of
                another dimensionality, ``inverse`` with an affine or without a velocity).
        """
        fn = "PreparedPair.register"
        if model.config.ndim != self.fixed.ndim:
            raise _ndim_error(fn, model, self.fixed)
        if inverse and self.chained and self.affine is not None:
            raise InputError(
                fn,
                "{0} inverts only the deformable field; this pair's transform also holds an "
                "affine: prepare it with init 'none' (for a pair already aligned, e.g. by "
                "'hyperreg affine')",
                "inverse",
            )
        # with an affine in the chain, _finish samples the original files through affine +
        # field: the model's own moved image, label map and Dice would be discarded
        inputs = dict(
            moving_seg=None if self.chained else self.aligned_seg,
            fixed_seg=None if self.chained else self.fixed_seg,
            images=not self.chained,
        )
        if passes is None:  # the model's own; an inverse field needs one pass
            passes = 1 if inverse else model.config.passes
        if passes != 1:
            if inverse:
                raise InputError(fn, "{0} needs a single network pass (passes 1)", "inverse")
            raw = [
                register_passes(
                    model,
                    self.aligned,
                    self.fixed,
                    float(lam),
                    passes,
                    refinement,
                    labels=self.labels,
                    normalization=self.normalization,
                    ncc=ncc,
                    **inputs,
                )
                for lam in lams
            ]
        elif (refinement is not None and refinement.steps > 0) or inverse:
            raw = [
                refine_pair(
                    model,
                    self.aligned,
                    self.fixed,
                    float(lam),
                    refinement or Refinement(steps=0),
                    normalization=self.normalization,
                    inverse=inverse,
                    **inputs,
                )
                for lam in lams
            ]
        else:
            raw = sweep_lambdas(
                model,
                self.aligned,
                self.fixed,
                list(lams),
                chunk=chunk,
                amp=amp,
                normalization=self.normalization,
                ncc=ncc,
                **inputs,
            )
        return [self._finish(r, refinement, model, never_worse, judged) for r in raw]

    def _chain(
        self, transform: AffineTransform, disp: np.ndarray | None, raw: RegistrationResult
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """``(moved, moved_seg, warp)`` through ``transform`` and ``disp`` (None: identity)."""
        if not self.chained and disp is None:  # the pair as it came, on the fixed grid
            seg = None if self.aligned_seg is None else self.aligned_seg.data
            return self.aligned.data, seg, np.zeros_like(raw.disp)
        if not self.chained:
            return raw.moved, raw.moved_seg, raw.disp
        moved = sample_volume(self.moving, transform, disp, self.fixed).data
        moved_seg = None
        if self.moving_seg is not None:
            moved_seg = sample_volume(self.moving_seg, transform, disp, self.fixed, label=True).data
        return moved, moved_seg, composed_displacement(transform, disp, self.fixed)

    def _finish(
        self,
        raw: RegistrationResult,
        refinement: Refinement | None,
        model: HyperMorph,
        never_worse: bool,
        judged: bool = True,
    ) -> PairResult:
        """The chain's outputs, typed statistics and verdict of one raw model result."""
        moved, moved_seg, warp = self._chain(self.transform, raw.disp, raw)
        verdict = self._verdict(model, refinement, moved, raw, never_worse) if judged else None
        kept = "registered" if verdict is None else verdict.kept
        disp = raw.disp
        if kept != "registered":  # the better of the pair as it came and the affine alone
            transform = self.transform if kept == "affine" else AffineTransform.identity()
            moved, moved_seg, warp = self._chain(transform, None, raw)
            disp = np.zeros_like(raw.disp)
        if verdict is not None and not verdict.ok:  # one line naming the pair (the CLI's only)
            names = [str(v.path) if v.path else "<in-memory>" for v in (self.moving, self.fixed)]
            logger.warning("'%s' -> '%s' at λ %g: %s", *names, raw.lam, verdict.text)
        dice = None
        if moved_seg is not None and self.fixed_seg is not None:
            dice = registration_dice(moved_seg, self.fixed_seg.data, labels=self.labels)
        stats = raw.refinement if raw.refinement is not None and raw.refinement.steps else None
        result = PairResult(
            lam=raw.lam,
            moved=moved,
            moved_seg=moved_seg,
            disp=disp,
            warp=warp,
            dice=dice,
            dice_before=self.dice_before if dice is not None else None,
            dice_affine=self.dice_affine if dice is not None else None,
            folding_fraction=raw.folding_fraction,
            log_jacobian_std=raw.log_jacobian_std,
            smoothness=raw.smoothness,
            ncc=raw.ncc,
            affine=self.affine,
            refinement=stats,
            inverse_disp=raw.inverse_disp,
            resampled=[*self.notes, *(n for n in raw.resampled if n not in self.notes)],
            verdict=verdict,
        )
        if kept != "registered":  # no field: its statistics are the identity's
            result.folding_fraction = result.log_jacobian_std = 0.0
            result.smoothness = 0.0 if result.smoothness is not None else None
            if result.inverse_disp is not None:
                result.inverse_disp = np.zeros_like(result.inverse_disp)
        return result

    def _verdict(
        self,
        model: HyperMorph,
        refinement: Refinement | None,
        moved: np.ndarray,
        raw: RegistrationResult,
        never_worse: bool,
    ) -> Verdict:
        """The verdict on one registration (:func:`~hyperreg.registration.verdict.judge`);
        the similarities before and after the affine are scored once per pair."""
        refined = refinement is not None and refinement.steps > 0
        objective = refine_objective(model, refinement) if refined else model.objective
        cache, norm = self._similarity, self.normalization
        if "fixed" not in cache:
            cache["fixed"] = network_input(model, self.fixed, self.fixed, norm)
        fixed_t = cache["fixed"]
        if objective.similarity not in cache:  # the pair as it came, and after the affine
            # as it came: the moving file straight onto the network grid through the headers
            # (NaN, not a candidate, for a 2D slice in another plane: it needs the affine)
            before_score = math.nan
            with contextlib.suppress(ValueError):
                before = self.moving if self.chained else self.aligned
                before_t = network_input(model, before, self.fixed, norm)
                before_score = network_similarity(objective, before_t, fixed_t)
            affine = network_input(model, self.aligned, self.fixed, norm) if self.chained else None
            cache[objective.similarity] = (
                before_score,
                None if affine is None else network_similarity(objective, affine, fixed_t),
            )
        before_score, affine_score = cache[objective.similarity]
        registered = on_fixed_grid(moved, self.fixed, self.moving)
        after = network_similarity(
            objective, network_input(model, registered, self.fixed, norm), fixed_t
        )
        shape = None if self.affine is None else decompose_affine(self.transform.matrix)
        return judge(
            before_score,
            affine_score,
            after,
            folding_fraction=raw.folding_fraction,
            affine=shape,
            never_worse=never_worse,
        )


def _ndim_error(fn: str, model: HyperMorph, fixed: Volume) -> InputError:
    message = "the model is {m}D but '{path}' is {f}D with shape {shape}; use a {f}D model"
    shape, m = fixed.spatial_shape, model.config.ndim
    return InputError(fn, message, "model", m=m, path=fixed.path, f=fixed.ndim, shape=shape)


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
            "initial_affine"), an unknown ``init``, an npz input without ``npz_geometry``
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
        raise _ndim_error(fn, model, fixed_v)
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
    if not resample:
        check_same_grid(moving_v, fixed_v)
    # the affine stage and the network see the same intensities (one rule, after the optional
    # bias correction); the outputs are sampled from the volumes as read
    seen = [model_image(v, normalization, bias_correct) for v in (moving_v, fixed_v)]
    if initial is not None and init == "none":
        transform, affine = initial, AffineStage.of(initial, "initial")
        chained = not _is_identity(transform, moving_v, fixed_v)
    elif initial is not None:
        transform = register_affine(*seen, init, seed=seed, initial=initial)
        affine = AffineStage.of(transform)
        chained = not _is_identity(transform, moving_v, fixed_v)
    else:
        transform = register_affine(*seen, init, seed=seed)
        affine = AffineStage.of(transform) if init != "none" else None
        chained = init != "none" and not _is_identity(transform, moving_v, fixed_v)
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
    )
    if seen[0] is not moving_v:
        pair.moving = moving_v
    if bias_correct:
        pair.notes.append("bias field corrected (N4) for the affine stage and the network")
    return pair


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
) -> PreparedPair:
    """The grids, label maps and baselines of a pair whose affine stage is done."""
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
    labels = dice_before = dice_affine = None
    if moving_seg is not None and fixed_seg is not None:
        labels, shared = label_sets(moving_seg.data, fixed_seg.data)
        if (message := label_ids_warning(moving_seg, fixed_seg, labels, shared)) is not None:
            warnings.warn(message, stacklevel=4)
        before_data = (
            aligned_seg.data
            if aligned_seg is not None
            else resample_to(moving_seg, fixed, label=True).data
        )
        dice_before = mean_registration_dice(before_data, fixed_seg.data, labels=labels)
        if chained and affine is not None:
            alone = sample_volume(moving_seg, transform, None, fixed, label=True).data
            dice_affine = mean_registration_dice(alone, fixed_seg.data, labels=labels)
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
    )
