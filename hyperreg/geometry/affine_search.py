"""A global start for the affine stage: a coarse rotation search scored by mutual information.

:func:`search_rotations` takes a rigid start (an ITK Euler transform centred on the fixed
image's centre of mass, translated onto the moving one's) and a coarse copy of the pair (voxels
of about 8 mm), and returns the few most promising orientations for the local optimiser of
:mod:`hyperreg.geometry.affine`. Candidates are a regular grid of rotations about that centre
(3D: each Euler angle in -60°, -30°, 0°, 30°, 60°, 125 in all; 2D: the in-plane angle from -90°
to 90° in 15° steps) and the proper rotations that carry the fixed image's principal axes
(intensity-weighted second moments) onto the moving image's; any extra candidates the caller
passes (e.g. the result of a first local run) join them. Each is scored by Mattes mutual
information over **every** voxel of the coarse fixed image (no random sampling) on one thread,
so the ranking is the same at any thread count. The best ones that differ from each other by
more than :data:`_DISTINCT_DEG` are returned, best first. :func:`looks_turned` is the cheap
probe the stage's early identity test asks first: does a 20° turn of the start score clearly
better?

Must not import torch, model or cli code (numpy and SimpleITK only).

References:
    Jenkinson & Smith, A global optimisation method for robust affine registration of brain
    images, Med Image Anal 2001 (FSL FLIRT's coarse rotation search, ``-searchrx/ry/rz``);
    Avants et al., ANTs ``antsAI`` (a grid of rotations scored by MI, the best refined locally);
    Alpert et al., The principal axes transformation, J Nucl Med 1990 (moments as a start).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import SimpleITK as sitk

__all__ = ["SEARCH_MM", "looks_turned", "score", "search_rotations"]

SEARCH_MM = 8.0  # voxel size (mm) of the coarse copy the candidates are scored on
_ANGLES_3D = (-60.0, -30.0, 0.0, 30.0, 60.0)  # degrees, per Euler angle
_ANGLES_2D = tuple(float(a) for a in range(-90, 91, 15))  # degrees, in-plane
_DISTINCT_DEG = 40.0  # returned candidates differ from each other by more than this rotation
_PROBE_DEG = 20.0  # looks_turned: the start turned by this much about each axis, both ways
# looks_turned: by how much (share of the start's MI) a turn must score better. Measured at 8 mm:
# OAS1_0001 tilted by 15° about one axis or rolled by 25°, the best 20° turn scored 18-46 %
# better than the start; on the nearly round phantoms of the tests, aligned but with noise, 2 %
# better (linear interpolation smooths the noise once samples leave the grid)
_PROBE_GAIN = 0.10
_BINS = 32  # Mattes histogram bins, as the local optimiser uses


def score(fixed: sitk.Image, moving: sitk.Image, transform: sitk.Transform) -> float:
    """Mattes MI (negative: lower is better) of ``moving`` through ``transform`` on every voxel
    of ``fixed`` (linear interpolation, 32 bins, one thread); ``inf`` without overlap."""
    method = sitk.ImageRegistrationMethod()
    method.SetMetricAsMattesMutualInformation(numberOfHistogramBins=_BINS)
    method.MetricUseFixedImageGradientFilterOff()
    method.MetricUseMovingImageGradientFilterOff()
    method.SetMetricSamplingStrategy(method.NONE)
    method.SetInterpolator(sitk.sitkLinear)
    method.SetNumberOfThreads(1)  # threaded sums round differently from run to run
    method.SetInitialTransform(transform, inPlace=False)
    try:
        value = float(method.MetricEvaluate(fixed, moving))
    except RuntimeError:  # "too many samples map outside moving image buffer"
        return math.inf
    return value if math.isfinite(value) else math.inf


def _rotation_of(transform: sitk.Transform) -> np.ndarray:
    concrete = transform.Downcast()
    ndim = concrete.GetDimension()
    return np.array(concrete.GetMatrix(), dtype=np.float64).reshape(ndim, ndim)


def _with_rotation(start: sitk.Transform, rotation: np.ndarray) -> sitk.Transform:
    """A copy of the Euler transform ``start`` (same centre and translation) with ``rotation``."""
    out = start.Downcast().__class__(start.Downcast())
    out.SetMatrix(tuple(float(v) for v in rotation.ravel()))
    return out


def _euler(angles_deg: tuple[float, ...]) -> np.ndarray:
    """Rotation matrix of Euler angles (degrees; 3D: about x, then y, then z, as ITK's
    ``Euler3DTransform`` composes them; 2D: one angle)."""
    transform: sitk.Transform
    if len(angles_deg) == 1:
        transform = sitk.Euler2DTransform()
        transform.SetAngle(math.radians(angles_deg[0]))
    else:
        transform = sitk.Euler3DTransform()
        transform.SetRotation(*(math.radians(a) for a in angles_deg))
    return _rotation_of(transform)


def _principal_axes(image: sitk.Image) -> np.ndarray | None:
    """``(ndim, ndim)`` eigenvectors (columns, largest spread first) of the intensity-weighted
    covariance of physical points; None when the image holds no positive mass."""
    data = sitk.GetArrayViewFromImage(image).astype(np.float64).T  # (I, J[, K])
    weights = np.clip(data - np.min(data), 0, None).ravel()
    total = weights.sum()
    if not total > 0:
        return None
    ndim = image.GetDimension()
    index = np.stack(np.meshgrid(*[np.arange(n) for n in data.shape], indexing="ij"), 0)
    index = index.reshape(ndim, -1).astype(np.float64)
    direction = np.array(image.GetDirection()).reshape(ndim, ndim)
    points = direction @ (index * np.array(image.GetSpacing())[:, None])  # origin drops out
    mean = points @ weights / total
    centred = points - mean[:, None]
    covariance = (centred * weights) @ centred.T / total
    values, vectors = np.linalg.eigh(covariance)
    return vectors[:, np.argsort(values)[::-1]]


def _axes_candidates(fixed: sitk.Image, moving: sitk.Image) -> list[np.ndarray]:
    """Proper rotations carrying the fixed principal axes onto the moving ones (each axis up to
    its sign: 2^(ndim-1) rotations); none when an image has no mass."""
    fixed_axes, moving_axes = _principal_axes(fixed), _principal_axes(moving)
    if fixed_axes is None or moving_axes is None:
        return []
    out = []
    for signs in itertools.product((1.0, -1.0), repeat=fixed.GetDimension()):
        rotation = moving_axes @ np.diag(signs) @ fixed_axes.T
        if np.linalg.det(rotation) > 0:
            out.append(rotation)
    return out


def _angle_between(a: np.ndarray, b: np.ndarray) -> float:
    """Rotation angle (degrees) of ``a^T b``."""
    relative = a.T @ b
    if len(relative) == 2:
        return abs(math.degrees(math.atan2(relative[1, 0], relative[0, 0])))
    cosine = (np.trace(relative) - 1) / 2
    return math.degrees(math.acos(min(1.0, max(-1.0, cosine))))


def looks_turned(fixed: sitk.Image, moving: sitk.Image, start: sitk.Transform) -> bool:
    """Whether turning ``start`` by 20° about one axis (either way; a slice: in its plane)
    scores a lower MI than ``start`` itself, by more than 10 % of it, on the coarse pair
    (:func:`score`).

    The affine stage's early identity test asks this before keeping an unmoved start: a rigid
    run from the identity can stay there on a head rolled by 25° (measured on OAS1_0001's
    256³ ``norm.mgz``: corners moved 2.6 mm, MI gained 0 %), while on an aligned pair every
    20° turn scores worse. Costs 7 metric evaluations (a slice: 3).
    """
    base = score(fixed, moving, start)
    ndim = fixed.GetDimension()
    for axis, sign in itertools.product(range(1 if ndim == 2 else 3), (1.0, -1.0)):
        angles = [0.0] * (1 if ndim == 2 else 3)
        angles[axis] = sign * _PROBE_DEG
        turned = _with_rotation(start, _euler(tuple(angles)) @ _rotation_of(start))
        if score(fixed, moving, turned) < base * (1 + _PROBE_GAIN):
            return True
    return False


def search_rotations(
    fixed: sitk.Image,
    moving: sitk.Image,
    start: sitk.Transform,
    *,
    extra: tuple[sitk.Transform, ...] = (),
    keep: int = 3,
) -> list[sitk.Transform]:
    """The ``keep`` best distinct orientations of the pair, best first.

    Args:
        fixed: Coarse fixed image (2D or 3D SimpleITK image, voxels of about
            :data:`SEARCH_MM`).
        moving: Coarse moving image, same dimension, any grid.
        start: An ``Euler2DTransform``/``Euler3DTransform`` (fixed physical point -> moving
            point) whose centre and translation every grid and principal-axes candidate keeps;
            its rotation is replaced.
        extra: Further candidate transforms (any ITK transform of the same dimension), scored
            as they are and returned as they are when among the best.
        keep: How many to return at most.

    Returns:
        New transforms (``start``'s type, or an ``extra`` itself), ordered by MI over every
        coarse fixed voxel (lower first; ties keep candidate order: extras first, then the
        grid, then the principal axes), each rotated by more than 40° from every one before it.
    """
    ndim = fixed.GetDimension()
    grid = [(a,) for a in _ANGLES_2D] if ndim == 2 else itertools.product(_ANGLES_3D, repeat=3)
    rotations = [_euler(tuple(angles)) for angles in grid]
    rotations += _axes_candidates(fixed, moving)
    candidates = list(extra) + [_with_rotation(start, r) for r in rotations]
    scores = [score(fixed, moving, c) for c in candidates]
    chosen: list[sitk.Transform] = []
    chosen_rotations: list[np.ndarray] = []
    for index in sorted(range(len(candidates)), key=lambda n: (scores[n], n)):
        if not math.isfinite(scores[index]) or len(chosen) == keep:
            break
        rotation = _rotation_of(candidates[index])
        if all(_angle_between(rotation, r) > _DISTINCT_DEG for r in chosen_rotations):
            chosen.append(candidates[index])
            chosen_rotations.append(rotation)
    return chosen
