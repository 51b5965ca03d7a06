"""The affine stage before deformable registration: SimpleITK's registration framework.

Owns :func:`register_affine` (rigid or affine, Mattes mutual information, 4 mm and 2 mm levels,
centre-of-mass start, early identity test, a global rotation search from
:mod:`hyperreg.geometry.affine_search`, in world space) and the transform it returns,
:class:`AffineTransform`: a ``(4, 4)`` RAS-mm matrix mapping a **fixed** world point to the
**moving** world point that lands on it (the direction ITK and ANTs transforms point). It also owns
the file format (:func:`save_affine`, :func:`load_affine`: ITK transform files that
``antsApplyTransforms`` and SimpleITK read) and resampling through an affine.

2D volumes (slices stored ``(I, J)`` or ``(I, J, 1)``) are registered in their own plane: both
slices are expressed in the fixed slice's in-plane frame, registered as true 2D SimpleITK images,
and the 2D result is lifted back to a world matrix that leaves the out-of-plane direction alone.
Must not import torch, model or cli code (numpy and SimpleITK only).

References:
    Mattes et al., PET-CT image registration in the chest using free-form deformations,
    IEEE TMI 2003 (the metric); ITK's ``ImageRegistrationMethodv4`` as wrapped by SimpleITK
    (Lowekamp et al., Front. Neuroinform. 2013; Yaniv et al., J Digit Imaging 2018).
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import SimpleITK as sitk

from hyperreg._errors import InputError, MissingInputError
from hyperreg._files import atomic_write
from hyperreg.geometry.affine_frame import RAS_TO_LPS, Frame, lift_lps, matrix_offset, sitk_affine
from hyperreg.geometry.affine_search import SEARCH_MM, looks_turned, search_rotations
from hyperreg.geometry.io import Volume, check_same_ndim
from hyperreg.geometry.resample import affine_3d, resample_through

__all__ = [
    "AFFINE_INITS",
    "TRANSFORM_SUFFIXES",
    "AffineTransform",
    "load_affine",
    "load_initial_affine",
    "register_affine",
    "resample_affine",
    "save_affine",
    "world_overlap",
]

logger = logging.getLogger(__name__)

AFFINE_INITS = ("affine", "rigid", "none")
TRANSFORM_SUFFIXES = (".mat", ".tfm", ".txt")
# metric samples per resolution level, whatever the image size (ANTs' affine default samples
# 25 % of the voxels at every level; 10 000 - 20 000 points hold a 32-bin joint histogram well)
_SAMPLES = (10_000, 20_000)
_Masks = tuple["sitk.Image | None", "sitk.Image | None"]
_LEVELS_MM = (4.0, 2.0)  # voxel size of each resolution level, coarse first
# Gaussian sigma applied after each level's block averaging, in voxels of that level (as ANTs
# smooths each shrunken level): a smoother MI cost. Measured on six native 2 mm IXI pairs
# (different people), sigma 4 mm then 2 mm: affine-alone DLMUSE Dice 0.424 -> 0.436 on average
# (label maps moved by nearest neighbour; ANTs' Affine scored the same way 0.431); 2 mm then
# 1 mm: 0.430; 4 mm then none at the 2 mm level: 0.427 (benchmarks/RESULTS_rotations.md)
_SMOOTH_VOXELS = 1.0
_LEVEL_VOXELS = (32, 64)  # at least this many voxels across the smallest extent per level
_SEARCH_VOXELS = 16  # the rotation search's level: SEARCH_MM voxels, at least this many across
_SEARCH_KEEP = 3  # distinct orientations of the search refined by the coarse rigid run
# a searched orientation replaces the first rigid run's result only when its coarse MI is lower
# by more than this share: on a nearly round phantom (test_native's, 32³ of 1.6 mm, 10° and
# 1.1x scale apart) a wrong orientation scored 2.4 % lower than the right one after the rigid
# run, and the affine then ended 12° off
_SEARCH_GAIN = 0.05
# affine: conjugate gradient with a line search, learning rate estimated once per level so
# that the first step moves no point more than this (mm)
_MAX_STEP_MM = (1.0, 0.5)
_CONVERGENCE = (1e-6, 10)  # affine: metric slope, window (iterations)
_MIN_RIGID_STEP = 1e-2  # rigid: regular-step descent stops below this step
_SEARCH_ITERATIONS = 100  # most iterations of the 4 mm rigid run from a searched orientation
# early test: a coarse rigid run that moves no corner _MIN_MOTION voxels and gains less than
# this share of mutual information keeps the start without running the rest of the stage
# (measured at 4 mm: the aligned neurite-oasis pair 1.8 %, the 10-degree phantom of the tests
# 60 %)
_EARLY_GAIN = 0.05
# voxels: a result that moves no fixed-grid corner this far keeps the identity (about 1 % of
# scale or 1 degree on a brain-sized grid: the deformable stage absorbs that much, and on
# aligned pairs such results are noise plus MI's slight zoom bias). Measured: the affinely
# aligned neurite-oasis slices 2.1 voxels (kept: identity), the multicontrast-2d S1 -> S2
# template-space heads 4.3 voxels (applied: about +0.025 NCC, as ANTs affine)
_MIN_MOTION = 3.0
_MAX_SCALE = 4.0  # a registration whose matrix scales any axis beyond this (or 1/this) diverged


@dataclass(frozen=True)
class AffineTransform:
    """A world-space affine: fixed RAS point -> moving RAS point (mm).

    Attributes:
        matrix: ``(4, 4)`` float64; ``moving_world = matrix @ [*fixed_world, 1]``.
        kind: ``"affine"``, ``"rigid"`` or ``"none"`` (identity).
        metric_before: Mattes mutual information (negative: lower is better) of the pair as it
            is (identity), full resolution, or NaN when nothing was computed.
        metric_after: The same through ``matrix``; equal to ``metric_before`` when the stage
            found nothing better and the identity was kept.
        seconds: Wall time of the registration.
    """

    matrix: np.ndarray
    kind: str = "none"
    metric_before: float = float("nan")
    metric_after: float = float("nan")
    seconds: float = 0.0

    @classmethod
    def identity(cls) -> AffineTransform:
        """The identity (``kind="none"``)."""
        return cls(np.eye(4))

    def voxel_map(self, moving: Volume, fixed: Volume) -> np.ndarray:
        """``(4, 4)`` map from fixed voxel ``(i, j, k, 1)`` to moving voxel (each its own grid)."""
        return np.linalg.inv(moving.affine) @ self.matrix @ fixed.affine

    def to_sitk(self) -> sitk.AffineTransform:
        """The same map as a 3D ITK transform in LPS mm (fixed physical point -> moving)."""
        linear = RAS_TO_LPS @ self.matrix[:3, :3] @ RAS_TO_LPS
        offset = RAS_TO_LPS @ self.matrix[:3, 3]
        transform = sitk.AffineTransform(3)
        transform.SetMatrix(tuple(float(v) for v in linear.ravel()))
        transform.SetTranslation(tuple(float(v) for v in offset))
        return transform


def _name(volume: Volume, role: str) -> str:
    return str(volume.path) if volume.path is not None else f"<in-memory {role}>"


def _corners(volume: Volume) -> np.ndarray:
    """World RAS corners ``(8, 3)`` of the voxel-centre box of ``volume`` (a slice: 4 twice)."""
    shape = list(volume.spatial_shape) + ([1] if volume.ndim == 2 else [])
    grid = np.stack(np.meshgrid(*[[0, n - 1] for n in shape], indexing="ij"), -1).reshape(-1, 3)
    return (volume.affine[:3, :3] @ grid.T).T + volume.affine[:3, 3]


def world_overlap(moving: Volume, fixed: Volume) -> bool:
    """Whether the world bounding boxes of the two volumes intersect (a slice counts as 1 mm)."""
    a, b = _corners(moving), _corners(fixed)
    low = np.maximum(a.min(0), b.min(0))
    high = np.minimum(a.max(0), b.max(0))
    return bool(np.all(high - low > -1.0))


def _shrink(image: sitk.Image, spacing: float, sigma: float = 0.0) -> sitk.Image:
    """``image`` averaged in blocks to voxels of about ``spacing`` mm (not shrunk when finer),
    then smoothed by a Gaussian of ``sigma`` mm (none when 0).

    Block averaging (``BinShrink``) is the anti-aliasing: each coarse voxel is the mean of the
    ``f`` voxels per axis it covers, ``f = round(spacing / own spacing)`` (at least 1). The
    Gaussian runs on the shrunken copy, so its cost does not grow with the image (on a 256³
    head, smoothing before shrinking took 4.6 s of CPU per pyramid).
    """
    factors = [max(1, round(spacing / s)) for s in image.GetSpacing()]
    if any(f > 1 for f in factors):
        image = sitk.BinShrink(image, factors)
    if sigma > 0 and min(image.GetSize()) >= 4:  # ITK's recursive Gaussian needs 4 voxels
        image = sitk.SmoothingRecursiveGaussian(image, sigma)
    return image


def _pyramid(frame: Frame, smooth: bool = True) -> list[tuple[sitk.Image, sitk.Image]]:
    """``(fixed, moving)`` images per level, coarse first: voxels of :data:`_LEVELS_MM`,
    smoothed (unless not ``smooth``) by a Gaussian of :data:`_SMOOTH_VOXELS` of the level's
    voxels, but coarse enough
    only to keep at least 32 (coarse level) and 64 (fine level) voxels across the fixed image's
    smallest extent, so small images (a 48 mm phantom) keep their detail. Each image's blocks
    follow its own spacing (the moving image may sit on another grid)."""
    extent = min(n * s for n, s in zip(frame.fixed.GetSize(), frame.fixed.GetSpacing()))
    spacings = [min(mm, extent / n) for mm, n in zip(_LEVELS_MM, _LEVEL_VOXELS)]
    sigmas = [_SMOOTH_VOXELS * mm if smooth else 0.0 for mm in spacings]
    return [
        (_shrink(frame.fixed, mm, sigma), _shrink(frame.moving, mm, sigma))
        for mm, sigma in zip(spacings, sigmas)
    ]


def _search_level(frame: Frame) -> tuple[sitk.Image, sitk.Image]:
    """``(fixed, moving)`` block-averaged to voxels of about ``SEARCH_MM`` (8 mm), but keeping
    at least 16 voxels across the fixed image's smallest extent (see :func:`_pyramid`)."""
    extent = min(n * s for n, s in zip(frame.fixed.GetSize(), frame.fixed.GetSpacing()))
    spacing = min(SEARCH_MM, extent / _SEARCH_VOXELS)
    return _shrink(frame.fixed, spacing), _shrink(frame.moving, spacing)


def _mattes(
    fixed: sitk.Image, seed: int, level: int, masks: _Masks = (None, None)
) -> sitk.ImageRegistrationMethod:
    """A registration method with Mattes MI (32 bins, linear interpolation) on at most
    ``_SAMPLES[level]`` random voxels of ``fixed`` drawn from ``seed``; samples outside
    ``masks`` (fixed, moving: :func:`_metric_masks`) do not count.

    Image gradients are taken at the samples (central differences) instead of from gradient
    images of both whole volumes, which ITK otherwise recomputes for every run and every
    metric evaluation: on the native 256³ OASIS pair the stage took 8 s instead of 17 s (one
    thread, loaded machine), the rigid runs converged in 16-23 iterations instead of stopping
    at their limit (200, 151), and the affine-alone aseg Dice was 0.416 instead of 0.405.
    """
    method = sitk.ImageRegistrationMethod()
    method.SetMetricAsMattesMutualInformation(numberOfHistogramBins=32)
    method.MetricUseFixedImageGradientFilterOff()
    method.MetricUseMovingImageGradientFilterOff()
    voxels = int(np.prod(fixed.GetSize()))
    method.SetMetricSamplingStrategy(method.RANDOM)
    method.SetMetricSamplingPercentage(min(1.0, _SAMPLES[level] / voxels), seed)
    method.SetInterpolator(sitk.sitkLinear)
    if masks[0] is not None:
        method.SetMetricFixedMask(masks[0])
    if masks[1] is not None:
        method.SetMetricMovingMask(masks[1])
    return method


def _method(
    fixed: sitk.Image, seed: int, iterations: int, level: int, rigid: bool, masks: _Masks
) -> sitk.ImageRegistrationMethod:
    """Mattes MI (32 bins) on at most ``_SAMPLES[level]`` jittered random voxels of ``fixed``
    with physical-shift scales, on one resolution (the images are already shrunk by
    :func:`_pyramid`). A rigid transform: regular-step gradient descent (first step 2, halved
    on every reversal of direction, down to :data:`_MIN_RIGID_STEP`); an affine: conjugate
    gradients with a line search (learning rate estimated once: first step at most
    ``_MAX_STEP_MM[level]``), stopped by a convergence window. Plain gradient descent creeps
    along the ill-conditioned rotation/shear directions of a 12-parameter affine and stopped
    10° short on the test phantom; regular steps on the affine left the aligned brain pair
    for MI 4x worse before coming back."""
    method = _mattes(fixed, seed + 1 + level, level, masks)
    # random samples are jittered inside their voxels: off-grid points avoid the interpolation
    # artefact of MI on a regular grid, which favours a few percent of shrinking (Pluim et al.)
    if rigid:
        method.SetOptimizerAsRegularStepGradientDescent(
            learningRate=2.0,
            minStep=_MIN_RIGID_STEP,
            numberOfIterations=iterations,
            relaxationFactor=0.5,
            gradientMagnitudeTolerance=1e-8,
        )
    else:
        method.SetOptimizerAsConjugateGradientLineSearch(
            learningRate=1.0,
            numberOfIterations=iterations,
            convergenceMinimumValue=_CONVERGENCE[0],
            convergenceWindowSize=_CONVERGENCE[1],
            lineSearchLowerLimit=0.0,
            lineSearchUpperLimit=4.0,
            lineSearchEpsilon=0.01,
            lineSearchMaximumIterations=10,
            estimateLearningRate=method.Once,
            maximumStepSizeInPhysicalUnits=_MAX_STEP_MM[level],
        )
    method.SetOptimizerScalesFromPhysicalShift()
    return method


def _run(
    level: tuple[sitk.Image, sitk.Image],
    transform: sitk.Transform,
    start: sitk.Transform | None,
    seed: int,
    iterations: int,
    index: int,
    masks: _Masks = (None, None),
) -> int:
    """Optimise ``transform`` in place on one level (after ``start``, the moving initial
    transform, when given); returns the number of iterations run."""
    fixed, moving = level
    rigid = transform.GetName().startswith("Euler")
    method = _method(fixed, seed, iterations, index, rigid, masks)
    if start is not None:
        method.SetMovingInitialTransform(start)
    method.SetInitialTransform(transform, inPlace=True)
    method.Execute(fixed, moving)
    return int(method.GetOptimizerIteration())


def _linear_of(transform: sitk.Transform, start: tuple[np.ndarray, np.ndarray] | None, ndim: int):
    """``(A, b)`` of ``start ∘ transform`` (``transform`` first, as ITK composes a moving
    initial transform)."""
    linear, offset = matrix_offset(transform, ndim)
    if start is None:
        return linear, offset
    return start[0] @ linear, start[0] @ offset + start[1]


def _as_affine(transform: sitk.Transform, ndim: int) -> sitk.AffineTransform:
    """The same map as an :class:`sitk.AffineTransform` with the same centre."""
    concrete = transform.Downcast()
    out = sitk.AffineTransform(ndim)
    out.SetCenter(concrete.GetCenter())
    out.SetMatrix(concrete.GetMatrix())
    out.SetTranslation(concrete.GetTranslation())
    return out


def _motion(matrix: np.ndarray, reference: np.ndarray, fixed: Volume) -> float:
    """Largest distance (mm) between where ``matrix`` and ``reference`` send a corner of the
    fixed grid."""
    corners = np.c_[_corners(fixed), np.ones(8)].T
    return float(np.max(np.linalg.norm((matrix - reference) @ corners, axis=0)))


def register_affine(
    moving: Volume,
    fixed: Volume,
    kind: str = "affine",
    *,
    iterations: int = 200,
    seed: int = 0,
    initial: AffineTransform | None = None,
    fixed_mask: Volume | None = None,
    moving_mask: Volume | None = None,
) -> AffineTransform:
    """Find the rigid or affine world transform that best aligns ``moving`` to ``fixed``.

    Two resolutions on block-averaged copies of the images, each smoothed by a Gaussian of one
    of its voxels (voxels of about 4 mm, then 2 mm, never coarser than 32 and 64 voxels across
    the smallest extent: an affine needs no finer detail), with Mattes mutual information (32
    bins, 10 000 then 20 000 jittered random voxels whatever the image size), so it works
    across contrasts and its cost does not grow with the volume. Intensities are used as they
    are (MI does not care about scale). Rigid runs use regular-step gradient descent, affine
    runs conjugate gradients with a line search.

    Without ``initial`` the stage starts from the centres of mass of the two images (ITK's
    moments initialiser: translation only; from the identity when they already agree within
    3 voxels), which also brings together pairs whose headers place them apart in world space
    (as ANTs does). Then: rigid at 4 mm (the early test below); unless the early test keeps
    the start, a **global search** for the orientation (as FSL FLIRT's ``-searchr*`` and ANTs'
    ``antsAI``): 125 rotations about the fixed centre of mass (each Euler angle in -60°..60°,
    30° steps; a slice: its in-plane angle in -90°..90°, 15° steps) and the principal-axes
    alignments are scored by MI over every voxel of 8 mm copies
    (:func:`hyperreg.geometry.affine_search.search_rotations`), the three best that differ by
    more than 40° are refined by the same 4 mm rigid run (at most 100 iterations: on two of
    three held-out IXI pairs at 2 mm a searched start that did not win ran to the
    200-iteration limit), and the one with the lowest 4 mm MI
    (the first rigid run's result included) goes on: for ``"rigid"`` a rigid run at 2 mm, for
    ``"affine"`` the affine at 4 mm and at 2 mm from it (a 2 mm rigid run before them cost
    about a fifth of the stage on three IXI pairs at 2 mm and did not raise the affine-alone
    Dice of six IXI pairs: 0.4356 with it, 0.4361 without). With ``initial`` (e.g. read by
    :func:`load_initial_affine`) there is no search, and the same runs optimise a correction
    applied **after** it (ITK's moving initial transform): ``initial ∘ correction``. The stage
    runs on one ITK thread whatever ``sitk.ProcessObject.SetGlobalDefaultNumberOfThreads``
    says (restored after), so the same inputs give the same transform at any thread count.

    The start (the identity, or ``initial``) is kept when the result moves no corner of the
    fixed grid by 3 voxels or more relative to it, or does not improve MI over it (MI at the
    2 mm level, same samples for both), so an already aligned pair is not made worse (MI with
    linear interpolation slightly favours zooming in on aligned images). **Early test:** when
    the 4 mm rigid run moves no corner by 3 voxels and gains less than 5 % of MI, and (without
    ``initial``) no 20° turn of the start about one axis scores 10 % better at 8 mm
    (:func:`~hyperreg.geometry.affine_search.looks_turned`: a rigid run can stay put on a head
    rolled by 25°), the start is kept without running the rest (an aligned pair costs one
    coarse rigid run and seven coarse metric evaluations).

    Args:
        moving: Moving image (2D or 3D, any grid, orientation and spacing).
        fixed: Fixed image, same dimensionality. 2D pairs must lie in one world plane.
        kind: ``"affine"`` (12 degrees of freedom in 3D, 6 in 2D), ``"rigid"`` (6 / 3) or
            ``"none"`` (``initial``, or the identity, is returned as is; nothing is computed).
        iterations: Most optimiser iterations per level.
        seed: Seed of the random (voxel-jittered) metric sampling; ITK gets ``seed + 1``
            (its 0 means the wall clock).
        initial: Start transform (fixed world point -> moving world point, RAS mm), or None.
        fixed_mask, moving_mask: Cost masks (boolean Volumes on their image's grid), or None:
            the metric counts only samples inside the fixed mask whose mapped point lies
            inside the moving mask (ANTs' ``-x``; SimpleITK's metric masks); for the centres
            of mass and the 8 mm orientation search, which score every voxel, the voxels
            outside are set to their image's minimum. With a mask the levels are not
            smoothed (smoothing would carry the intensities left out into counted voxels).

    Returns:
        An :class:`AffineTransform` (fixed world point -> moving world point, RAS mm) whose
        ``metric_before`` is the MI at the start, ``metric_after`` at the result.

    Warns:
        UserWarning: If an image is constant (the start is returned).

    Raises:
        ValueError: On an unknown ``kind``, 2D with 3D, or a registration that diverges
            (non-finite or degenerate matrix: an axis scaled by more than 4x or less than 1/4,
            or a reflection).

    References:
        Mattes et al., IEEE TMI 2003 (the metric); ITK ``ImageRegistrationMethodv4`` and
        ``CenteredTransformInitializer`` (moments) as wrapped by SimpleITK; ANTs
        ``antsRegistration`` (centre-of-mass start, multi-resolution affine); Jenkinson &
        Smith, Med Image Anal 2001 (FLIRT's coarse rotation search).
    """
    fn = "register_affine"
    if kind not in AFFINE_INITS:
        raise ValueError(f"{fn}(): 'kind' must be one of {AFFINE_INITS}, got {kind!r}")
    check_same_ndim(fn, moving, fixed)
    if initial is not None and not isinstance(initial, AffineTransform):
        raise TypeError(
            f"{fn}(): 'initial' must be an AffineTransform or None, got {type(initial).__name__}"
        )
    start = initial if initial is not None else AffineTransform.identity()
    if kind == "none":
        return start
    for volume, role in ((moving, "moving"), (fixed, "fixed")):
        if volume.data.size == 0 or float(np.ptp(volume.data)) == 0.0:
            text = (
                f"'{_name(volume, role)}' is constant, so it holds nothing to align; the {kind} "
                "stage keeps its start"
            )
            if volume.path is None:
                warnings.warn(text, stacklevel=2)
            else:  # load_volume warned when it read the file: once is enough
                logger.debug(text)
            return AffineTransform(start.matrix, kind)
    if initial is None and not world_overlap(moving, fixed):
        logger.info(
            "'%s' and '%s' do not overlap in world space; starting from their centres of mass",
            _name(moving, "moving"),
            _name(fixed, "fixed"),
        )
    # the stage runs on one ITK thread, so the result repeats exactly at any thread setting:
    # ITK's Mattes metric merges its threads' joint histograms in the order they finish, so
    # threaded sums round differently from run to run (measured on a 256³ head tilted by
    # 20/15/20°: two 2-thread runs gave matrix entries 0.04 and translations 1 mm apart), and
    # near a decision (which start wins, whether the identity is kept) that changed the result
    threads = sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()
    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(1)
    try:
        return _register(moving, fixed, kind, iterations, seed, initial, (fixed_mask, moving_mask))
    finally:
        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(threads)


def _register(
    moving: Volume,
    fixed: Volume,
    kind: str,
    iterations: int,
    seed: int,
    initial: AffineTransform | None,
    mask_volumes: tuple[Volume | None, Volume | None] = (None, None),
) -> AffineTransform:
    """:func:`register_affine` after its checks."""
    fn = "register_affine"
    tic = time.perf_counter()
    frame = Frame(moving, fixed, _name(moving, "moving"))
    masks = _metric_masks(frame, *mask_volumes)
    # with a cost mask, no smoothing: it would carry the intensities the mask leaves out (a
    # cavity, the part of the head a cut scan lacks) into the voxels the metric counts
    levels = _pyramid(frame, smooth=all(m is None for m in mask_volumes))
    ndim = frame.fixed.GetDimension()
    rigid: sitk.Transform = sitk.Euler2DTransform() if ndim == 2 else sitk.Euler3DTransform()
    start_matrix = np.eye(4) if initial is None else initial.matrix
    start = None if initial is None else frame.from_world(initial.matrix)
    start_itk = None if start is None else sitk_affine(*start)
    coarse_fixed, coarse_moving = levels[0]
    threshold = _MIN_MOTION * min(fixed.spacing)
    if initial is None:
        rigid = _centres_of_mass(coarse_fixed, coarse_moving, rigid)
        offset = frame.to_world(*matrix_offset(rigid, ndim))
        if _motion(offset, start_matrix, fixed) < threshold:
            # the centres of mass agree: start from the identity (the early test below then
            # asks whether a coarse rigid run finds anything to correct)
            rigid.SetTranslation((0.0,) * ndim)
    else:  # the correction after ``initial`` starts at the identity, centred on the fixed grid
        centre = coarse_fixed.TransformContinuousIndexToPhysicalPoint(
            [(n - 1) / 2 for n in coarse_fixed.GetSize()]
        )
        rigid.SetCenter(centre)
    centred = rigid.__class__(rigid)  # the centres-of-mass start, kept for the search
    search = _search_level(frame)  # 8 mm copies for the search (and the early test's probe)
    # 4 mm: a rigid run (the early test), then the affine; 2 mm: the transform of ``kind``
    steps = [_run(levels[0], rigid, start_itk, seed, iterations, 0, masks)]
    matrix = frame.to_world(*_linear_of(rigid, start, ndim))
    motion = _motion(matrix, start_matrix, fixed)
    early = False
    if motion < threshold:  # early test: did the coarse rigid run find anything to correct?
        coarse_before = _mutual_information(
            *levels[0], frame.from_world(start_matrix), seed, 0, masks
        )
        coarse_after = _mutual_information(*levels[0], frame.from_world(matrix), seed, 0, masks)
        early = not coarse_after < coarse_before * (1 + _EARLY_GAIN)
        if early and initial is None:  # unless a 20° turn of the start scores better at 8 mm
            early = not looks_turned(*search, centred)
    transform: sitk.Transform = rigid
    if not early:
        if initial is None:  # a global start: the best of a rotation search and the run above
            rigid = transform = _global_start(
                frame.ndim, levels[0], search, centred, rigid, seed, iterations, steps, masks
            )
        last = len(levels) - 1
        if kind != "affine":  # an affine starts from the 4 mm rigid result and runs both levels
            steps.append(_run(levels[-1], rigid, start_itk, seed, iterations, last, masks))
        else:
            transform = _as_affine(rigid, ndim)
            for index, level in enumerate(levels):
                steps.append(_run(level, transform, start_itk, seed, iterations, index, masks))
        matrix = frame.to_world(*_linear_of(transform, start, ndim))
        motion = _motion(matrix, start_matrix, fixed)
    _check_matrix(fn, matrix, moving, fixed)
    finest = levels[-1]
    before = _mutual_information(*finest, frame.from_world(start_matrix), seed, -1, masks)
    after = (
        before if early else _mutual_information(*finest, frame.from_world(matrix), seed, -1, masks)
    )
    seconds = time.perf_counter() - tic
    logger.debug(
        "%s(): %s in %.2f s (%s iterations per run), MI %.4f -> %.4f",
        fn,
        kind,
        seconds,
        steps,
        before,
        after,
    )
    improved = math.isnan(before) or after < before
    if early or not improved or motion < threshold:
        # an already-aligned pair: nothing better than where it started, or a change of a few
        # voxels (MI with linear interpolation favours a slight zoom on aligned images);
        # debug: the result's identity_kept says it (the command line prints it once)
        logger.debug(
            "the %s stage moved the fixed grid's corners by at most %.2f mm%s with mutual "
            "information %.4f -> %.4f; keeping the %s",
            kind,
            motion,
            " at 4 mm (early test)" if early else "",
            before,
            after,
            "identity" if initial is None else "initial transform",
        )
        return AffineTransform(start_matrix, kind, before, before, seconds)
    return AffineTransform(matrix, kind, before, after, seconds)


def _metric_masks(frame: Frame, fixed: Volume | None, moving: Volume | None) -> _Masks:
    """The cost masks as SimpleITK ``uint8`` images in ``frame`` (None where not given); the
    frame's voxels outside them are set to their image's minimum, so that the centres of mass
    and the orientation search (which score every voxel) ignore them too."""
    found: list[sitk.Image | None] = []
    for mask, role in ((fixed, "fixed"), (moving, "moving")):
        image = getattr(frame, role)
        if mask is None:
            found.append(None)
            continue
        # the mask is on its image's grid: same pixels, so the image's geometry in the frame
        as_image = sitk.GetImageFromArray(np.ascontiguousarray(mask.data.astype(np.uint8).T))
        as_image.CopyInformation(image)
        low = float(sitk.GetArrayViewFromImage(image).min())
        setattr(frame, role, sitk.Mask(image, as_image, outsideValue=low))
        found.append(as_image)
    return found[0], found[1]


def _global_start(
    ndim: int,
    coarse: tuple[sitk.Image, sitk.Image],
    search: tuple[sitk.Image, sitk.Image],
    centred: sitk.Transform,
    found: sitk.Transform,
    seed: int,
    iterations: int,
    steps: list[int],
    masks: _Masks = (None, None),
) -> sitk.Transform:
    """The best rigid start for the rest of the stage: ``found`` (the coarse rigid run from the
    centres of mass) or one of the other orientations :func:`search_rotations` ranks best at
    8 mm (``centred``'s centre and translation, rotated), each refined by the same coarse rigid
    run; the winner has the lowest MI on the coarse level's samples, and a searched one must
    beat ``found`` by more than :data:`_SEARCH_GAIN` of it. Appends the iterations of each run
    to ``steps``."""
    found_value = _mutual_information(*coarse, matrix_offset(found, ndim), seed, 0, masks)
    best, best_value = found, found_value * (1 + _SEARCH_GAIN)
    values = []
    for candidate in search_rotations(*search, centred, extra=(found,), keep=_SEARCH_KEEP):
        if candidate is found:
            continue
        most = min(iterations, _SEARCH_ITERATIONS)
        steps.append(_run(coarse, candidate, None, seed, most, 0, masks))
        value = _mutual_information(*coarse, matrix_offset(candidate, ndim), seed, 0, masks)
        values.append(value)
        if value < best_value or (math.isnan(best_value) and not math.isnan(value)):
            best, best_value = candidate, value
    logger.debug(
        "rotation search: coarse MI %.4f from the centres of mass, %s from the search; %s kept",
        found_value,
        [round(v, 4) for v in values],
        "the first" if best is found else "a searched start",
    )
    return best


def _centres_of_mass(
    fixed: sitk.Image, moving: sitk.Image, rigid: sitk.Transform
) -> sitk.Transform:
    """``rigid`` centred on the fixed centre of mass, translated onto the moving one (ITK's
    moments initialiser: translation only); the grid centres when a total mass is zero."""
    try:
        found = sitk.CenteredTransformInitializer(
            fixed, moving, rigid, sitk.CenteredTransformInitializerFilter.MOMENTS
        )
    except RuntimeError:  # zero total mass (e.g. negative intensities): the grid centres
        found = sitk.CenteredTransformInitializer(
            fixed, moving, rigid, sitk.CenteredTransformInitializerFilter.GEOMETRY
        )
    return found.Downcast()


def _mutual_information(
    fixed: sitk.Image,
    moving: sitk.Image,
    linear_offset: tuple[np.ndarray, np.ndarray],
    seed: int,
    level: int = -1,
    masks: _Masks = (None, None),
) -> float:
    """Mattes MI (negative, lower is better) of the pair through the frame map ``(A, b)``, at
    most ``_SAMPLES[level]`` random voxels drawn from ``seed`` (the same for every transform);
    NaN when too few samples land in the moving image (no overlap)."""
    method = _mattes(fixed, seed + 1, level, masks)  # jittered samples, as in the registration
    method.SetInitialTransform(sitk_affine(*linear_offset), inPlace=False)
    try:
        return float(method.MetricEvaluate(fixed, moving))
    except RuntimeError:  # "too many samples map outside moving image buffer"
        return float("nan")


def _check_matrix(fn: str, matrix: np.ndarray, moving: Volume, fixed: Volume) -> None:
    linear = matrix[:3, :3]
    scales = np.linalg.svd(linear, compute_uv=False) if np.all(np.isfinite(matrix)) else None
    if (
        scales is None
        or np.linalg.det(linear) <= 0
        or scales.max() > _MAX_SCALE
        or scales.min() < 1 / _MAX_SCALE
    ):
        shown = "non-finite" if scales is None else f"axis scales {np.round(scales, 3).tolist()}"
        raise InputError(
            fn,
            "the affine stage diverged for '{moving}' -> '{fixed}' ({shown}); check that the "
            "images show the same anatomy, or use a 'rigid' stage or none",
            "moving",
            moving=_name(moving, "moving"),
            fixed=_name(fixed, "fixed"),
            shown=shown,
        )


def resample_affine(
    moving: Volume, fixed: Volume, transform: AffineTransform, *, label: bool = False
) -> Volume:
    """``moving`` resampled onto the fixed grid through ``transform`` (one interpolation).

    Fixed voxel ``x`` takes ``moving`` at world point ``transform.matrix @ fixed.affine @ x``;
    points outside the moving image get 0.

    Args:
        moving: Image (float) or label map (integer).
        fixed: Volume whose grid the result takes.
        transform: Fixed-world to moving-world map.
        label: Nearest neighbour (int32 out) instead of linear (float32 out).

    Returns:
        A volume on ``fixed``'s grid (its affine and disk shape) with ``moving``'s path.

    Raises:
        ValueError: If the dimensionalities differ.
    """
    if moving.ndim != fixed.ndim:
        raise ValueError(
            f"resample_affine(): '{_name(moving, 'moving')}' and '{_name(fixed, 'fixed')}' "
            "must both be 2D or both 3D"
        )
    return resample_through(moving, fixed, transform.to_sitk(), label=label, fn="resample_affine")


def _in_xy_plane(matrix: np.ndarray) -> bool:
    """The map leaves z alone and mixes nothing into or out of it (an x-y plane transform)."""
    return bool(
        np.allclose(matrix[2], [0.0, 0.0, 1.0, 0.0], atol=1e-9)
        and np.allclose(matrix[:2, 2], 0.0, atol=1e-9)
    )


def save_affine(path: str | os.PathLike[str], transform: AffineTransform, ndim: int = 3) -> Path:
    """Write ``transform`` as an ITK transform file (``.mat`` binary, ``.tfm``/``.txt`` text).

    The file holds an ITK affine in LPS mm mapping fixed physical points to moving ones, as
    ``antsApplyTransforms -t file.mat`` and ``sitk.ReadTransform`` expect: a 3D
    ``AffineTransform_double_3_3``, or, for a 2D registration (``ndim=2``) whose map leaves z
    alone (slices in the x-y plane, as ITK and ANTs read 2D images), the 2D
    ``AffineTransform_double_2_2`` they apply to 2D images. Any other 2D registration (e.g. a
    coronal slice) is written as its 3D equivalent, which leaves the slice normal alone.

    Raises:
        ValueError: If the suffix is not one of ``.mat``, ``.tfm``, ``.txt``.
    """
    path = Path(path)
    if not path.name.lower().endswith(TRANSFORM_SUFFIXES):
        raise ValueError(
            f"save_affine(): '{path}' must end in one of {TRANSFORM_SUFFIXES}, got "
            f"{''.join(path.suffixes)!r}"
        )
    itk = transform.to_sitk()
    if ndim == 2 and _in_xy_plane(transform.matrix):
        flip = RAS_TO_LPS[:2, :2]
        itk = sitk.AffineTransform(2)
        itk.SetMatrix(tuple(float(v) for v in (flip @ transform.matrix[:2, :2] @ flip).ravel()))
        itk.SetTranslation(tuple(float(v) for v in flip @ transform.matrix[:2, 3]))
    return atomic_write(path, lambda tmp: sitk.WriteTransform(itk, str(tmp)))


def _read_linear(fn: str, path: Path) -> tuple[np.ndarray, int]:
    """World RAS ``(4, 4)`` of an ITK linear transform file and the file's dimension (a 2D
    x-y plane transform, LPS, is lifted to 3D with z left alone).

    Raises:
        FileNotFoundError: If ``path`` does not exist (a ``MissingInputError``, argument
            ``"path"``).
        InputError (a ValueError): If the file is not a readable 2D or 3D linear transform, or
            its matrix is not finite (argument ``"path"``).
    """
    if not path.is_file():
        raise MissingInputError(fn, "no such file: '{path}'", "path", path=path)
    try:
        transform = sitk.ReadTransform(str(path))
        dim = transform.GetDimension()
        if dim == 2:  # an x-y plane map (save_affine, ANTs 2D)
            linear, offset = matrix_offset(transform, 2)
            flip = RAS_TO_LPS[:2, :2]
            matrix = np.eye(4)
            matrix[:2, :2] = flip @ linear @ flip
            matrix[:2, 3] = flip @ offset
        elif dim != 3:
            raise ValueError(f"a {dim}D transform")
        else:
            matrix = lift_lps(transform)
    except (RuntimeError, ValueError) as err:
        reason = str(err) if isinstance(err, ValueError) else "ITK cannot read it as a transform"
        raise InputError(
            fn,
            "'{path}' is not an affine transform file ({reason})",
            "path",
            path=path,
            reason=reason,
        ) from err
    if not np.all(np.isfinite(matrix)):
        raise InputError(fn, "'{path}' holds a non-finite matrix", "path", path=path)
    return matrix, dim


def load_affine(path: str | os.PathLike[str]) -> AffineTransform:
    """Read an ITK affine (or rigid) transform file written by hyperreg, ANTs or SimpleITK.

    A 2D transform (x-y plane, LPS) is lifted to 3D with z left alone.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the file is not a readable 2D or 3D linear transform.
    """
    matrix, _ = _read_linear("load_affine", Path(path))
    return AffineTransform(matrix, "affine")


def load_initial_affine(
    path: str | os.PathLike[str], moving: Volume, fixed: Volume
) -> AffineTransform:
    """Read an initial affine for a pair (``--initial-affine``) and check that it fits the pair.

    Reads any ITK linear transform file (``.mat`` binary or ``.tfm``/``.txt`` text): the
    ``--affine-out`` of an earlier hyperreg run (:func:`save_affine`), ANTs'
    ``antsRegistration`` ``0GenericAffine.mat`` (the ``-r``/``--initial-moving-transform`` that
    ANTs takes) or ``sitk.WriteTransform`` of an ``AffineTransform``/``Euler3DTransform``/
    ``Similarity3DTransform`` (any centre). As in ITK and ANTs, the file maps a **fixed**
    physical point (LPS mm) to the **moving** point that lands on it; in memory it becomes
    :class:`AffineTransform` (RAS mm, same direction). Use the result with
    ``register_affine(moving, fixed, "none", initial=t)`` (applied as is) or ``"affine"`` /
    ``"rigid"`` (refined from it); the affine stage is then skipped or started from it.

    Args:
        path: The transform file.
        moving: Moving image of the pair (any grid).
        fixed: Fixed image of the pair, same dimensionality.

    Returns:
        The transform, ``kind="affine"``.

    Raises:
        FileNotFoundError: If ``path`` does not exist (a ``MissingInputError``, argument
            ``"path"``).
        ValueError: With a one-line message naming ``path`` (an ``InputError``, argument
            ``"path"``, except for a pair of two dimensionalities): the file is not a linear
            (affine) transform (a displacement field, a composite, not a transform file); its
            dimensionality does not fit the pair (a 2D transform for a 3D pair, or a map that
            moves a 2D pair's slice out of the moving slice's plane); its matrix is singular,
            a reflection or scales an axis beyond 4x (or 1/4); or it maps less than 1 % of the
            fixed image's field of view into the moving image (written for another pair, or
            the inverse direction).

    References:
        ITK transform file format (``itk::TransformFileReader``); ANTs
        ``antsRegistration --initial-moving-transform``.
    """
    fn = "load_initial_affine"
    path = Path(path)
    check_same_ndim(fn, moving, fixed)
    matrix, dim = _read_linear(fn, path)
    if dim == 2 and fixed.ndim == 3:
        raise InputError(fn, "'{path}' holds a 2D transform, but the pair is 3D", "path", path=path)
    scales = np.linalg.svd(matrix[:3, :3], compute_uv=False)
    if np.linalg.det(matrix[:3, :3]) <= 0 or scales.max() > _MAX_SCALE or scales.min() < 0.25:
        raise InputError(
            fn,
            "'{path}' is not a usable initial affine (axis scales {scales}, determinant "
            "{det:.3g}; expected a proper rotation with scales within 1/4 and 4)",
            "path",
            path=path,
            scales=np.round(scales, 3).tolist(),
            det=np.linalg.det(matrix[:3, :3]),
        )
    inside = _seen_fraction(matrix, moving, fixed)
    if fixed.ndim == 2 and inside.plane > 0.5:
        raise InputError(
            fn,
            "'{path}' maps the fixed slice up to {plane:.3g} slices out of the plane of the "
            "moving slice '{moving}'; a 2D pair needs an in-plane transform",
            "path",
            path=path,
            plane=inside.plane,
            moving=_name(moving, "moving"),
        )
    if inside.share < 0.01:
        raise InputError(
            fn,
            "'{path}' maps the fixed image's field of view outside the moving image '{moving}' "
            "({percent:.2g} % of it lands inside); was it written for another pair, or for the "
            "inverse direction (moving -> fixed)?",
            "path",
            path=path,
            moving=_name(moving, "moving"),
            percent=100 * inside.share,
        )
    return AffineTransform(matrix, "affine")


@dataclass(frozen=True)
class _Seen:
    share: float  # of the fixed grid's points that land inside the moving grid
    plane: float  # 2D: largest distance (moving slices) of a fixed corner from the moving plane


def _seen_fraction(matrix: np.ndarray, moving: Volume, fixed: Volume) -> _Seen:
    """How much of the fixed grid (up to 24 points per axis) ``matrix`` sends into the moving
    grid (voxel centres within half a voxel of the grid)."""
    axes = [np.linspace(0, n - 1, min(n, 24)) for n in fixed.spatial_shape]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), 0).reshape(fixed.ndim, -1)
    points = np.vstack([grid, np.zeros((3 - fixed.ndim, grid.shape[1])), np.ones(grid.shape[1])])
    voxels = np.linalg.inv(affine_3d(moving)) @ matrix @ affine_3d(fixed) @ points
    shape = list(moving.spatial_shape) + [1] * (3 - moving.ndim)
    ok = np.all([(voxels[n] > -0.5) & (voxels[n] < shape[n] - 0.5) for n in range(3)], axis=0)
    plane = float(np.max(np.abs(voxels[2]))) if moving.ndim == 2 else 0.0
    return _Seen(float(ok.mean()), plane)
