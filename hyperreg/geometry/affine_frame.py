"""Where the affine stage registers a pair: 3D LPS mm, or a 2D slice's in-plane frame.

Owns the conversions between hyperreg's world matrices (``(4, 4)`` RAS mm, fixed point -> moving
point) and ITK's linear transforms (LPS mm, ``p -> A p + b``), and :class:`Frame`, which turns a
pair of :class:`~hyperreg.geometry.io.Volume` into SimpleITK images: 3D as they are, 2D slices
expressed in the fixed slice's in-plane frame (a true 2D registration whose result leaves the
out-of-plane direction alone). Used by :mod:`hyperreg.geometry.affine`.

Must not import torch, model or cli code (numpy and SimpleITK only).
"""

from __future__ import annotations

import math

import numpy as np
import SimpleITK as sitk

from hyperreg._errors import InputError
from hyperreg.geometry.io import Volume
from hyperreg.geometry.resample import to_sitk

__all__ = [
    "RAS_TO_LPS",
    "Frame",
    "lift_lps",
    "matrix_offset",
    "plane_frame",
    "plane_image",
    "sitk_affine",
]

RAS_TO_LPS = np.diag([-1.0, -1.0, 1.0])


def plane_frame(fixed: Volume) -> tuple[np.ndarray, np.ndarray]:
    """Origin ``(3,)`` and orthonormal in-plane axes ``(3, 2)`` of a 2D fixed slice (RAS)."""
    columns = fixed.affine[:3, :2]
    first = columns[:, 0] / np.linalg.norm(columns[:, 0])
    second = columns[:, 1] - first * (first @ columns[:, 1])
    second /= np.linalg.norm(second)
    return fixed.affine[:3, 3].copy(), np.stack([first, second], 1)


def plane_image(
    volume: Volume, origin: np.ndarray, axes: np.ndarray, name: str = "<in-memory moving>"
) -> sitk.Image:
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
        raise InputError(
            "register_affine",
            "the 2D slice '{name}' and the fixed 2D slice lie in different world planes "
            "({angle:.0f}° apart, e.g. axial against coronal); a 2D registration needs slices "
            "of the same plane: register the 3D volumes instead",
            "moving",
            name=name,
            angle=angle,
        )
    image = sitk.GetImageFromArray(np.ascontiguousarray(volume.data.astype(np.float32).T))
    image.SetSpacing(tuple(float(s) for s in spacing))
    image.SetOrigin(tuple(float(v) for v in axes.T @ (volume.affine[:3, 3] - origin)))
    image.SetDirection(tuple(float(v) for v in (linear / spacing).ravel()))
    return image


def matrix_offset(transform: sitk.Transform, ndim: int) -> tuple[np.ndarray, np.ndarray]:
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


def lift_lps(transform: sitk.Transform) -> np.ndarray:
    """World RAS ``(4, 4)`` of a 3D LPS transform (fixed point -> moving point)."""
    matrix, offset = matrix_offset(transform, 3)
    out = np.eye(4)
    out[:3, :3] = RAS_TO_LPS @ matrix @ RAS_TO_LPS
    out[:3, 3] = RAS_TO_LPS @ offset
    return out


def sitk_affine(linear: np.ndarray, offset: np.ndarray) -> sitk.AffineTransform:
    """An ITK affine ``p -> linear @ p + offset`` of the matching dimension (centre 0)."""
    transform = sitk.AffineTransform(len(offset))
    transform.SetMatrix(tuple(float(v) for v in linear.ravel()))
    transform.SetTranslation(tuple(float(v) for v in offset))
    return transform


class Frame:
    """Where a pair is registered: 3D LPS mm, or a 2D slice's in-plane frame (mm).

    Converts the pair to SimpleITK images and world RAS ``(4, 4)`` matrices to and from
    ``(A, b)`` maps of the frame (``p -> A p + b``, fixed point -> moving point).
    """

    def __init__(
        self, moving: Volume, fixed: Volume, moving_name: str = "<in-memory moving>"
    ) -> None:
        self.ndim = fixed.ndim
        if fixed.ndim == 2:
            self.origin, self.axes = plane_frame(fixed)
            self.fixed = plane_image(fixed, self.origin, self.axes)
            self.moving = plane_image(moving, self.origin, self.axes, moving_name)
        else:
            self.fixed = sitk.Cast(to_sitk(fixed), sitk.sitkFloat32)
            self.moving = sitk.Cast(to_sitk(moving), sitk.sitkFloat32)

    def to_world(self, linear: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """World RAS ``(4, 4)`` of a frame map (2D: in-plane as given, normal left alone)."""
        out = np.eye(4)
        if self.ndim == 2:
            axes, origin = self.axes, self.origin
            full = axes @ linear @ axes.T + (np.eye(3) - axes @ axes.T)
            out[:3, :3] = full
            out[:3, 3] = origin - full @ origin + axes @ offset
        else:
            out = lift_lps(sitk_affine(linear, offset))
        return out

    def from_world(self, matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The frame map ``(A, b)`` of a world RAS matrix (2D: its in-plane part)."""
        if self.ndim == 2:
            axes, origin = self.axes, self.origin
            linear = axes.T @ matrix[:3, :3] @ axes
            offset = axes.T @ (matrix[:3, :3] @ origin + matrix[:3, 3] - origin)
            return linear, offset
        return RAS_TO_LPS @ matrix[:3, :3] @ RAS_TO_LPS, RAS_TO_LPS @ matrix[:3, 3]
