"""hyperreg: HyperMorph deformable registration of brain MRI with a MIP hypernetwork.

One hypernetwork, conditioned on the regularisation weight λ (``lam``), generates every weight of
a VoxelMorph-style U-Net, so a single trained model registers a scan pair at any λ in [0, 1].

Conventions (fixed for the whole package):

* images ``moving``, ``fixed``, ``moved``: ``(B, C, *S)`` float32, ``S = (H, W)`` or ``(D, H, W)``;
* displacement ``disp``: ``(B, N, *S)`` with ``N = len(S)``, in voxels of the fixed grid, channel
  ``n`` along array axis ``n`` (i, j, k order, not x, y, z); ``moved[x] = moving(x + disp(x))``;
* velocity ``velocity``: same layout, voxels per unit time, integrated by scaling and squaring;
* λ in [0, 1]; loss(λ) = (1 − λ) · similarity + λ · smoothness;
* NIfTI affines travel with the data (:class:`hyperreg.io.Volume`) and every output carries the
  fixed image's affine; label maps are warped with nearest-neighbour interpolation.

Importing the package has no side effects: no device is chosen, nothing is seeded.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
