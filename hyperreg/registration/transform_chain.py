"""The affine + field transform of one registration as one object: :class:`TransformChain`.

A chain sends voxel ``x`` of its output grid (``grid``, the fixed image for a forward chain) to
the world point ``q(x) = M @ A_g @ (x + u(x))`` of its source image (``source``, the moving
image), with ``M`` a world affine (:class:`~hyperreg.geometry.affine.AffineTransform`, RAS mm)
and ``u`` a displacement ``(N, *S)`` in voxels of ``grid``, i/j/k order (STYLE §2). Applying
it, composing it into one field and writing it wrap :func:`~hyperreg.registration.chain.
sample_volume`, :func:`~hyperreg.registration.chain.composed_displacement` and
:func:`~hyperreg.geometry.fields.save_displacement` (voxel or ITK form).

:meth:`TransformChain.inverse` is the whole chain inverted, affine included, and lives on the
**source** grid: ``chain.inverse().apply(fixed)`` lands the fixed image on the moving grid.
With ``v`` the deformable part's inverse on ``grid`` (``exp(−v)`` of the model's velocity,
:func:`~hyperreg.registration.refine.inverse_displacement`), a moving voxel ``m`` goes to the
fixed voxel ``y = A_g^-1 M^-1 A_s m``, then to ``y + v(y)``; written in the chain's own form
(affine ``M^-1``, field on the source grid) its field is ``u'(m) = L v(y(m))`` with ``L`` the
linear part of the voxel map ``A_s^-1 M A_g`` (``v`` sampled linearly at ``y``, edge values
beyond the grid). Must not import training, apps or cli.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hyperreg.geometry.affine import AffineTransform
from hyperreg.geometry.fields import save_displacement
from hyperreg.geometry.io import Volume
from hyperreg.geometry.resample import affine_3d
from hyperreg.registration.chain import composed_displacement, sample_volume

__all__ = ["TransformChain"]


@dataclass(frozen=True, eq=False)
class TransformChain:
    """An affine followed by a displacement field, from ``grid`` voxels to ``source`` world.

    Attributes:
        affine: ``grid`` world -> ``source`` world (RAS mm); the identity without an affine.
        disp: Deformable displacement ``(N, *S)`` in voxels of ``grid`` (``S`` its spatial
            shape), applied before the affine, or None (the affine alone).
        grid: The grid the chain is defined on (outputs land on it): the fixed image.
        source: The image the chain samples (its grid and world): the moving image.
        inverse_disp: The inverse of ``disp`` on ``grid`` (``(N, *S)`` voxels,
            ``v(y) ≈ −u(y + v(y))``), or None; needed by :meth:`inverse` when ``disp`` is set.
    """

    affine: AffineTransform
    disp: np.ndarray | None
    grid: Volume
    source: Volume
    inverse_disp: np.ndarray | None = None
    _of: TransformChain | None = field(default=None, repr=False)

    def apply(self, volume: Volume, *, label: bool = False, padding: str = "zeros") -> Volume:
        """``volume`` (on ``source``'s world, any grid) sampled through the chain onto ``grid``.

        Linear for images (float32), nearest for label maps (``label=True``, int32); one
        interpolation (:func:`~hyperreg.registration.chain.sample_volume`, its padding rule).
        """
        return sample_volume(
            volume, self.affine, self.disp, self.grid, label=label, padding=padding
        )

    def displacement(self) -> np.ndarray:
        """The chain as one field ``(N, *S)`` float32 in voxels of ``grid`` (hyperreg's voxel
        format, :func:`~hyperreg.registration.chain.composed_displacement`)."""
        return composed_displacement(self.affine, self.disp, self.grid)

    def write(self, path: str | os.PathLike[str], *, format: str = "voxel") -> Path:
        """Write :meth:`displacement` on ``grid`` atomically, ``format`` ``"voxel"`` or ``"itk"``
        (world mm, LPS; :func:`~hyperreg.geometry.fields.save_displacement`, its errors)."""
        return save_displacement(path, self.displacement(), self.grid, format=format)

    def inverse(self) -> TransformChain:
        """The whole chain inverted, on ``source``'s grid (module docstring for the formula).

        Returns:
            A chain from ``source`` voxels to ``grid`` world: affine ``M^-1``, field ``(N', *S')``
            in voxels of ``source``. Its own :meth:`inverse` is this chain.

        Raises:
            ValueError: If ``disp`` is set without ``inverse_disp`` (a model without a velocity
                field has no inverse).
        """
        if self._of is not None:
            return self._of
        if self.disp is not None and self.inverse_disp is None:
            raise ValueError(
                "TransformChain.inverse(): the chain has a field but no inverse field; register "
                "with inverse=True (a model with a velocity field)"
            )
        back = AffineTransform(np.linalg.inv(self.affine.matrix), kind=self.affine.kind)
        disp = None
        if self.inverse_disp is not None:
            voxel_map = np.linalg.inv(affine_3d(self.source)) @ self.affine.matrix
            linear = (voxel_map @ affine_3d(self.grid))[: self.source.ndim, : self.grid.ndim]
            parts = [self._component(channel, back) for channel in self.inverse_disp]
            disp = np.einsum("rn,n...->r...", linear, np.stack(parts)).astype(np.float32)
        return TransformChain(back, disp, self.source, self.grid, self.disp, _of=self)

    def _component(self, channel: np.ndarray, back: AffineTransform) -> np.ndarray:
        """One channel of ``inverse_disp`` sampled at ``y(m)`` onto ``source``'s grid."""
        grid = self.grid
        as_volume = Volume(
            channel.astype(np.float32), grid.affine, grid.disk_shape, None, grid.codes
        )
        return sample_volume(as_volume, back, None, self.source, padding="border").data
