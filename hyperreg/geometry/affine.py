"""The affine stage before deformable registration: SimpleITK's registration framework.

Owns :func:`register_affine` (rigid or affine, Mattes mutual information, multi-resolution,
moments initialisation, in world space) and the transform it returns, :class:`AffineTransform`:
a ``(4, 4)`` RAS-mm matrix mapping a **fixed** world point to the **moving** world point that
lands on it (the direction ITK and ANTs transforms point). It also owns the file format
(:func:`save_affine`, :func:`load_affine`: ITK transform files that ``antsApplyTransforms`` and
SimpleITK read) and resampling through an affine.

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

from hyperreg._files import atomic_write
from hyperreg.geometry.io import Volume
from hyperreg.geometry.resample import resample_through, to_sitk

__all__ = [
    "AFFINE_INITS",
    "TRANSFORM_SUFFIXES",
    "AffineTransform",
    "load_affine",
    "register_affine",
    "resample_affine",
    "save_affine",
    "world_overlap",
]

logger = logging.getLogger(__name__)

AFFINE_INITS = ("affine", "rigid", "none")
_RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0])
TRANSFORM_SUFFIXES = (".mat", ".tfm", ".txt")
_SAMPLES = 50_000  # most metric samples per resolution level
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
        linear = _RAS_TO_LPS @ self.matrix[:3, :3] @ _RAS_TO_LPS
        offset = _RAS_TO_LPS @ self.matrix[:3, 3]
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


def _plane_frame(fixed: Volume) -> tuple[np.ndarray, np.ndarray]:
    """Origin ``(3,)`` and orthonormal in-plane axes ``(3, 2)`` of a 2D fixed slice (RAS)."""
    columns = fixed.affine[:3, :2]
    first = columns[:, 0] / np.linalg.norm(columns[:, 0])
    second = columns[:, 1] - first * (first @ columns[:, 1])
    second /= np.linalg.norm(second)
    return fixed.affine[:3, 3].copy(), np.stack([first, second], 1)


def _plane_image(volume: Volume, origin: np.ndarray, axes: np.ndarray) -> sitk.Image:
    """A 2D SimpleITK image of a slice in the plane frame ``(origin, axes)`` (mm).

    Raises:
        ValueError: If the slice's plane is tilted by more than 60° against the frame's (e.g.
            an axial slice against a coronal one): its projection would squash an axis.
    """
    linear = axes.T @ volume.affine[:3, :2]  # plane coordinates per voxel step
    spacing = np.linalg.norm(linear, axis=0)
    own = np.linalg.norm(volume.affine[:3, :2], axis=0)
    if np.any(spacing < 0.5 * own):
        normal = np.cross(axes[:, 0], axes[:, 1])
        theirs = np.cross(volume.affine[:3, 0], volume.affine[:3, 1])
        cosine = abs(float(normal @ theirs)) / float(np.linalg.norm(theirs))
        angle = math.degrees(math.acos(min(1.0, cosine)))
        raise ValueError(
            f"register_affine(): the 2D slice '{_name(volume, 'moving')}' and the fixed 2D "
            f"slice lie in different world planes ({angle:.0f}° apart, e.g. axial against "
            "coronal); a 2D registration needs slices of the same plane: register the 3D "
            "volumes instead"
        )
    image = sitk.GetImageFromArray(np.ascontiguousarray(volume.data.astype(np.float32).T))
    image.SetSpacing(tuple(float(s) for s in spacing))
    image.SetOrigin(tuple(float(v) for v in axes.T @ (volume.affine[:3, 3] - origin)))
    image.SetDirection(tuple(float(v) for v in (linear / spacing).ravel()))
    return image


def _matrix_offset(transform: sitk.Transform, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    """``(A, b)`` with ``transform(p) = A p + b`` for any ITK matrix-offset transform.

    Raises:
        ValueError: If ``transform`` is not a linear (matrix + offset) transform.
    """
    concrete = transform.Downcast()
    if not all(hasattr(concrete, m) for m in ("GetMatrix", "GetCenter", "GetTranslation")):
        raise ValueError(f"a {concrete.GetName()}, not a linear transform")
    matrix = np.array(concrete.GetMatrix(), dtype=np.float64).reshape(ndim, ndim)
    centre = np.array(concrete.GetCenter(), dtype=np.float64)
    return matrix, centre + np.array(concrete.GetTranslation()) - matrix @ centre


def _lift_plane(transform: sitk.Transform, origin: np.ndarray, axes: np.ndarray) -> np.ndarray:
    """World ``(4, 4)`` of a 2D plane transform: in-plane as ``transform``, normal unchanged."""
    matrix2, offset2 = _matrix_offset(transform, 2)
    linear = axes @ matrix2 @ axes.T + (np.eye(3) - axes @ axes.T)
    out = np.eye(4)
    out[:3, :3] = linear
    out[:3, 3] = origin - linear @ origin + axes @ offset2
    return out


def _lift_lps(transform: sitk.Transform) -> np.ndarray:
    """World RAS ``(4, 4)`` of a 3D LPS transform (fixed point -> moving point)."""
    matrix, offset = _matrix_offset(transform, 3)
    out = np.eye(4)
    out[:3, :3] = _RAS_TO_LPS @ matrix @ _RAS_TO_LPS
    out[:3, 3] = _RAS_TO_LPS @ offset
    return out


def _method(image: sitk.Image, seed: int, iterations: int) -> sitk.ImageRegistrationMethod:
    """Mattes MI, regular-step gradient descent, three levels sized to ``image``.

    The finest level is the image shrunk so that no axis exceeds about 160 voxels (an affine
    needs no finer detail, and a 256³ volume at full resolution costs minutes); each level
    samples at most ``_SAMPLES`` random voxels (all of them when the level is smaller).
    """
    size = image.GetSize()
    finest = max(1, int(np.ceil(max(size) / 160)))
    shrinks = [4 * finest, 2 * finest, finest]
    method = sitk.ImageRegistrationMethod()
    method.SetMetricAsMattesMutualInformation(numberOfHistogramBins=32)
    voxels = [int(np.prod([max(1, s // f) for s in size])) for f in shrinks]
    # random samples are jittered inside their voxels: off-grid points avoid the interpolation
    # artefact of MI on a regular grid, which favours a few percent of shrinking (Pluim et al.)
    method.SetMetricSamplingStrategy(method.RANDOM)
    method.SetMetricSamplingPercentagePerLevel([min(1.0, _SAMPLES / v) for v in voxels], seed + 1)
    method.SetInterpolator(sitk.sitkLinear)
    method.SetOptimizerAsRegularStepGradientDescent(
        learningRate=2.0,
        minStep=1e-4,
        numberOfIterations=iterations,
        relaxationFactor=0.6,
        gradientMagnitudeTolerance=1e-8,
    )
    method.SetOptimizerScalesFromPhysicalShift()
    method.SetShrinkFactorsPerLevel(shrinks)
    method.SetSmoothingSigmasPerLevel([2.0, 1.0, 0.0])
    method.SmoothingSigmasAreSpecifiedInPhysicalUnitsOff()
    return method


def register_affine(
    moving: Volume,
    fixed: Volume,
    kind: str = "affine",
    *,
    iterations: int = 200,
    seed: int = 0,
) -> AffineTransform:
    """Find the rigid or affine world transform that best aligns ``moving`` to ``fixed``.

    Moments initialisation (centres of mass and principal axes), then a rigid stage, then (for
    ``"affine"``) a full affine stage started from it; each stage runs on three resolutions
    (the finest with no axis above about 160 voxels; smoothing 2, 1, 0 voxels) with
    regular-step gradient descent on Mattes mutual information (32 bins, at most 50 000 random
    voxels per level, all of them for a 2D slice), so it works across contrasts. Intensities are
    used as they are (MI does not care about scale). Finally the MI of the pair as it is and
    through the result are compared at full resolution: when the result is not better, or when
    it moves no corner of the fixed grid by 3 voxels or more, the identity is returned (so an
    already-aligned pair is not made worse by this stage; MI with linear interpolation
    slightly favours zooming in on aligned images).

    Args:
        moving: Moving image (2D or 3D, any grid, orientation and spacing).
        fixed: Fixed image, same dimensionality. 2D pairs must lie in one world plane.
        kind: ``"affine"`` (12 degrees of freedom in 3D, 6 in 2D), ``"rigid"`` (6 / 3) or
            ``"none"`` (identity, nothing is computed).
        iterations: Most optimiser iterations per resolution level.
        seed: Seed of the random (voxel-jittered) metric sampling; ITK gets ``seed + 1``
            (its 0 means the wall clock). 2D runs on one thread and repeats exactly; 3D repeats up
            to the rounding of ITK's threaded sums.

    Returns:
        An :class:`AffineTransform` (fixed world point -> moving world point, RAS mm).

    Warns:
        UserWarning: If an image is constant (the identity is returned).

    Raises:
        ValueError: On an unknown ``kind``, 2D with 3D, images that do not overlap in world
            space, or a registration that diverges (non-finite or degenerate matrix: an axis
            scaled by more than 4x or less than 1/4, or a reflection).
    """
    fn = "register_affine"
    if kind not in AFFINE_INITS:
        raise ValueError(f"{fn}(): 'kind' must be one of {AFFINE_INITS}, got {kind!r}")
    if moving.ndim != fixed.ndim:
        raise ValueError(
            f"{fn}(): '{_name(moving, 'moving')}' is {moving.ndim}D but "
            f"'{_name(fixed, 'fixed')}' is {fixed.ndim}D; both must be 2D or both 3D"
        )
    if kind == "none":
        return AffineTransform.identity()
    if not world_overlap(moving, fixed):
        raise ValueError(
            f"{fn}(): '{_name(moving, 'moving')}' and '{_name(fixed, 'fixed')}' do not overlap "
            "in world space (their bounding boxes are disjoint); check the headers"
        )
    for volume, role in ((moving, "moving"), (fixed, "fixed")):
        if volume.data.size == 0 or float(np.ptp(volume.data)) == 0.0:
            warnings.warn(
                f"{fn}(): '{_name(volume, role)}' is constant, so it holds nothing to align; "
                f"the {kind} stage keeps the identity",
                stacklevel=2,
            )
            return AffineTransform(np.eye(4), kind)
    if fixed.ndim == 3:
        return _register(moving, fixed, kind, iterations, seed)
    # a slice runs on one ITK thread, so the result repeats exactly (threaded sums round
    # differently from run to run, and near the identity that decides what is kept)
    threads = sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()
    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(1)
    try:
        return _register(moving, fixed, kind, iterations, seed)
    finally:
        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(threads)


def _register(
    moving: Volume, fixed: Volume, kind: str, iterations: int, seed: int
) -> AffineTransform:
    """:func:`register_affine` after its checks."""
    fn = "register_affine"
    start = time.perf_counter()
    if fixed.ndim == 2:
        origin, axes = _plane_frame(fixed)
        fixed_image = _plane_image(fixed, origin, axes)
        moving_image = _plane_image(moving, origin, axes)
        rigid: sitk.Transform = sitk.Euler2DTransform()
        full: sitk.Transform = sitk.AffineTransform(2)
    else:
        fixed_image = sitk.Cast(to_sitk(fixed), sitk.sitkFloat32)
        moving_image = sitk.Cast(to_sitk(moving), sitk.sitkFloat32)
        rigid = sitk.Euler3DTransform()
        full = sitk.AffineTransform(3)
    try:
        initial = sitk.CenteredTransformInitializer(
            fixed_image, moving_image, rigid, sitk.CenteredTransformInitializerFilter.MOMENTS
        )
    except RuntimeError:  # zero total mass (e.g. negative intensities): the grid centres
        initial = sitk.CenteredTransformInitializer(
            fixed_image, moving_image, rigid, sitk.CenteredTransformInitializerFilter.GEOMETRY
        )
    method = _method(fixed_image, seed, iterations)
    method.SetInitialTransform(initial, inPlace=True)
    method.Execute(fixed_image, moving_image)
    result: sitk.Transform = initial
    if kind == "affine":
        full.SetCenter(initial.GetCenter())
        full.SetMatrix(initial.GetMatrix())
        full.SetTranslation(initial.GetTranslation())
        method = _method(fixed_image, seed, iterations)
        method.SetInitialTransform(full, inPlace=True)
        method.Execute(fixed_image, moving_image)
        result = full
    if fixed.ndim == 2:
        matrix = _lift_plane(result, origin, axes)
    else:
        matrix = _lift_lps(result)
    _check_matrix(fn, matrix, moving, fixed)
    identity = sitk.AffineTransform(fixed_image.GetDimension())
    before = _mutual_information(fixed_image, moving_image, identity, seed)
    after = _mutual_information(fixed_image, moving_image, result, seed)
    seconds = time.perf_counter() - start
    logger.debug("%s(): %s in %.2f s, MI %.4f -> %.4f", fn, kind, seconds, before, after)
    corners = np.c_[_corners(fixed), np.ones(8)].T
    motion = float(np.max(np.linalg.norm((matrix - np.eye(4)) @ corners, axis=0)))
    if not after < before or motion < _MIN_MOTION * min(fixed.spacing):
        # an already-aligned pair: nothing better than where it started, or a change of a few
        # voxels
        # (MI with linear interpolation favours a slight zoom on aligned images)
        logger.info(
            "%s(): the %s stage moved the fixed grid's corners by at most %.2f mm with mutual "
            "information %.4f -> %.4f; keeping the identity",
            fn,
            kind,
            motion,
            before,
            after,
        )
        return AffineTransform(np.eye(4), kind, before, before, seconds)
    return AffineTransform(matrix, kind, before, after, seconds)


def _mutual_information(
    fixed: sitk.Image, moving: sitk.Image, transform: sitk.Transform, seed: int
) -> float:
    """Mattes MI (negative, lower is better) of the pair through ``transform``, full resolution,
    at most ``_SAMPLES`` random voxels drawn from ``seed`` (the same for every transform)."""
    method = sitk.ImageRegistrationMethod()
    method.SetMetricAsMattesMutualInformation(numberOfHistogramBins=32)
    voxels = int(np.prod(fixed.GetSize()))
    method.SetMetricSamplingStrategy(method.RANDOM)  # jittered, as in the registration
    method.SetMetricSamplingPercentage(min(1.0, _SAMPLES / voxels), seed + 1)
    method.SetInterpolator(sitk.sitkLinear)
    method.SetInitialTransform(transform, inPlace=False)
    return float(method.MetricEvaluate(fixed, moving))


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
        raise ValueError(
            f"{fn}(): the affine stage diverged for '{_name(moving, 'moving')}' -> "
            f"'{_name(fixed, 'fixed')}' ({shown}); check that the images show the same anatomy "
            "or use --init rigid / none"
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
        flip = _RAS_TO_LPS[:2, :2]
        itk = sitk.AffineTransform(2)
        itk.SetMatrix(tuple(float(v) for v in (flip @ transform.matrix[:2, :2] @ flip).ravel()))
        itk.SetTranslation(tuple(float(v) for v in flip @ transform.matrix[:2, 3]))
    return atomic_write(path, lambda tmp: sitk.WriteTransform(itk, str(tmp)))


def load_affine(path: str | os.PathLike[str]) -> AffineTransform:
    """Read an ITK affine (or rigid) transform file written by hyperreg, ANTs or SimpleITK.

    A 2D transform (x-y plane, LPS) is lifted to 3D with z left alone.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the file is not a readable 2D or 3D linear transform.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"load_affine(): no such file: '{path}'")
    try:
        transform = sitk.ReadTransform(str(path))
        if transform.GetDimension() == 2:  # an x-y plane map (save_affine, ANTs 2D)
            linear, offset = _matrix_offset(transform, 2)
            flip = _RAS_TO_LPS[:2, :2]
            matrix = np.eye(4)
            matrix[:2, :2] = flip @ linear @ flip
            matrix[:2, 3] = flip @ offset
        elif transform.GetDimension() != 3:
            raise ValueError(f"a {transform.GetDimension()}D transform")
        else:
            matrix = _lift_lps(transform)
    except (RuntimeError, ValueError) as err:
        reason = str(err) if isinstance(err, ValueError) else "ITK cannot read it as a transform"
        raise ValueError(
            f"load_affine(): '{path}' is not an affine transform file ({reason})"
        ) from err
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"load_affine(): '{path}' holds a non-finite matrix")
    return AffineTransform(matrix, "affine")
