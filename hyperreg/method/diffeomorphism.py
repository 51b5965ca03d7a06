"""Non-diffeomorphic volume (NDV) and area (NDA) of a displacement field, as Learn2Reg reports it.

The usual folding measure (:func:`hyperreg.method.metrics.folding_fraction`) counts voxels whose
central-difference Jacobian determinant is ``≤ 0``. Central differences skip the voxel itself
and miss folds between neighbours (the "checkerboard problem"). Liu et al. (2024) instead split
each voxel into simplices whose corners are voxel centres. In 2D a pixel gives 4 triangles, 2
per triangulation. In 3D a voxel gives 10 tetrahedra, 5 per decomposition (4 corner tetrahedra
and 1 central one). The deformation is linear on each simplex, so a negative determinant there
means the simplex is inverted. NDV is the volume of the inverted simplices, averaged over the
two decompositions. The Learn2Reg LUMIR challenge reports it as "NDV", in % of the volume.
Must not import nibabel or hyperreg modules other than ``_checks``.

Exactly what is computed, on ``φ(x) = x + u(x)`` in voxels, after padding ``u`` by one voxel
with its edge value (as the reference implementation does):

* 2D: for each pixel and each ``(s0, s1) ∈ {+, −}²``, ``J_s`` is the determinant of the forward
  (``+``: ``φ(x + e) − φ(x)``) or backward (``−``: ``φ(x) − φ(x − e)``) differences along each
  axis. The pixel's non-diffeomorphic area is ``Σ_s ½ · max(−J_s, 0) / 2``. Each triangle has
  area ``J_s / 2``, and the factor ``½`` averages the two triangulations.
* 3D: the 8 sign combinations of forward/backward differences (corner tetrahedra, volume
  ``J/6``), plus the two central tetrahedra ``J1*`` (columns ``φ(x−e0−e1)−φ(x)``,
  ``φ(x−e0−e2)−φ(x)``, ``φ(x−e1−e2)−φ(x)``) and ``J2*`` (``φ(x+e0+e1)−φ(x)``,
  ``φ(x+e1+e2)−φ(x)``, ``φ(x+e0+e2)−φ(x)``), each of volume ``J/6`` (``J = 2`` at identity).
  The voxel's NDV is ``Σ ½ · max(−J, 0) / 6`` over all 10.

The result is a fraction of the total volume in [0, 1]. It is 0 for any field whose simplices
all keep their orientation, and 1 where every simplex is inverted (e.g. a mirror reflection in
the interior).

References:
    Liu, Y., Chen, J., Wei, S., Carass, A., Prince, J. On finite difference Jacobian computation
    in deformable image registration. IJCV 2024 (arXiv:2212.06060); reference code
    ``yihao6/digital_diffeomorphism``. Learn2Reg LUMIR (Chen et al., 2024) reports NDV.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor

from hyperreg._checks import check_field

__all__ = ["non_diffeomorphic_map", "non_diffeomorphic_volume"]


def _shift(phi: Tensor, offset: tuple[int, ...]) -> Tensor:
    """``φ(x + offset)`` on the interior of a 1-voxel padded ``(N, *S+2)`` array: ``(N, *S)``."""
    index = [slice(None)] + [slice(1 + o, phi.shape[1 + a] - 1 + o) for a, o in enumerate(offset)]
    return phi[tuple(index)]


def _det(columns: list[Tensor]) -> Tensor:
    """Determinant of the matrix whose column ``a`` is ``columns[a]`` (each ``(N, *S)``)."""
    m = torch.stack(columns, dim=-1).movedim(0, -2)  # (*S, N components, N columns)
    return torch.linalg.det(m)


@torch.no_grad()
def non_diffeomorphic_map(disp: Tensor) -> Tensor:
    """Per-voxel non-diffeomorphic volume (3D) or area (2D) of one displacement field.

    Args:
        disp: Displacement ``(1, N, *S)`` or ``(N, *S)`` in voxels, ``N`` in {2, 3}, i/j/k order
            (``φ(x) = x + disp(x)``).

    Returns:
        ``(*S)`` tensor (float64) of the share of each voxel's volume that lies in inverted
        simplices, in [0, 1] (see the module docstring for the exact scheme).

    Raises:
        TypeError: If ``disp`` is not a floating-point tensor.
        ValueError: If ``disp`` is not a single 2D or 3D field.

    References:
        Liu et al., IJCV 2024; see the module docstring.
    """
    unbatched = isinstance(disp, Tensor) and disp.ndim == disp.shape[0] + 1
    field = disp.unsqueeze(0) if unbatched else disp
    check_field("non_diffeomorphic_map", "disp", field)
    if field.shape[0] != 1:
        raise ValueError(
            f"non_diffeomorphic_map(): 'disp' must hold one field, got shape {tuple(disp.shape)}"
        )
    ndim = field.shape[1]
    u = field.to(torch.float64)
    padded = F.pad(u, [1, 1] * ndim, mode="replicate")[0]  # (N, *S+2)
    axes = [torch.arange(-1, s + 1, dtype=torch.float64, device=u.device) for s in u.shape[2:]]
    phi = padded + torch.stack(torch.meshgrid(*axes, indexing="ij"))
    centre = _shift(phi, (0,) * ndim)

    def diff(sign: int, axis: int) -> Tensor:
        step = tuple(sign if a == axis else 0 for a in range(ndim))
        return (_shift(phi, step) - centre) * sign  # forward (+1) or backward (-1) difference

    total = torch.zeros(u.shape[2:], dtype=torch.float64, device=u.device)
    for signs in itertools.product((1, -1), repeat=ndim):
        jac = _det([diff(s, a) for a, s in enumerate(signs)])
        total += 0.5 * (-jac).clamp_min(0) / (2 if ndim == 2 else 6)
    if ndim == 3:
        for sign, pairs in ((-1, ((0, 1), (0, 2), (1, 2))), (1, ((0, 1), (1, 2), (0, 2)))):
            columns = []
            for a, b in pairs:
                step = tuple(sign if axis in (a, b) else 0 for axis in range(3))
                columns.append(_shift(phi, step) - centre)
            total += 0.5 * (-_det(columns)).clamp_min(0) / 6
    return total


def non_diffeomorphic_volume(disp: Tensor) -> float:
    """Non-diffeomorphic volume (3D) or area (2D) as a fraction of the whole grid.

    The mean of :func:`non_diffeomorphic_map`. Multiply by 100 for the percentage that
    Learn2Reg LUMIR reports as NDV.

    Args:
        disp: Displacement ``(1, N, *S)`` or ``(N, *S)`` in voxels.

    Returns:
        A fraction in [0, 1].

    Raises:
        TypeError, ValueError: As :func:`non_diffeomorphic_map`.
    """
    return float(non_diffeomorphic_map(disp).mean())
