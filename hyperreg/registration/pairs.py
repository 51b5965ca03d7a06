"""Run a model on one prepared pair: the layer every application (and validation) builds on.

It owns the pair boundary between loaded :class:`~hyperreg.geometry.io.Volume` objects and a
:class:`~hyperreg.method.model.HyperMorph`: checking a pair against the model, bringing every
input onto the fixed grid (:func:`prepare_pair`), turning a volume into the model's input tensor
(:func:`model_input`), turning a model output into a :class:`RegistrationResult` on the fixed
grid (:func:`result_from_output`) and the check of output paths before any work
(:func:`check_outputs`); one registration of loaded volumes is
:func:`hyperreg.registration.lambdas.register_pair`. Must not import training, apps or cli.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hyperreg._errors import InputError, passed_as
from hyperreg.geometry.intensity import normalize_intensity
from hyperreg.geometry.io import SAVE_SUFFIXES, VOLUME_SAVE_SUFFIXES, Volume, check_same_grid
from hyperreg.geometry.io import same_grid
from hyperreg.geometry.resample import conformed_grid, describe_grid, isotropic_grid, resample_to
from hyperreg.method.metrics import registration_dice
from hyperreg.method.model import HyperMorph, RegistrationOutput
from hyperreg.method.spatial import jacobian_determinant, sample_at, warp
from hyperreg.registration.memory import release_freed_memory
from hyperreg.registration.results import RegistrationResult

__all__ = [
    "OUTPUT_SUFFIXES",
    "InputError",
    "NetworkGrid",
    "PathLike",
    "RegistrationResult",
    "check_outputs",
    "model_input",
    "network_grid",
    "network_inputs",
    "network_tensor",
    "onto_fixed_grid",
    "onto_grid",
    "prepare_pair",
    "result_from_output",
    "reused_network_tensors",
    "smoothness_of",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]
_SLAB_VOXELS = 524_288  # fixed voxels per slab in NetworkGrid.to_fixed (bounds memory)
OUTPUT_SUFFIXES = SAVE_SUFFIXES  # what fields.save_displacement writes (displacements)
FIELD_OUTPUTS = ("warp_out", "inverse_warp_out", "field_out", "warp")  # the rest: io.save_volume


def onto_grid(
    fn: str,
    volume: Volume,
    grid: Volume,
    role: str,
    *,
    label: bool,
    resample: bool,
    target: str = "fixed",
) -> tuple[Volume, str | None]:
    """``volume`` on ``grid``: unchanged, resampled (with a message), or a ValueError."""
    if same_grid(volume, grid):
        return volume, None
    if not resample:
        check_same_grid(volume, grid)  # raises, naming both files, shapes and spacings
    moved = resample_to(volume, grid, label=label)
    message = (
        f"resampled {role} '{volume.path}' ({describe_grid(volume)}) onto the {target} grid "
        f"({describe_grid(grid)})"
    )
    logger.debug("%s(): %s", fn, message)
    return moved, message


def model_input(volume: Volume, normalization: str, device: torch.device) -> torch.Tensor:
    data = normalize_intensity(volume.data, normalization)
    if normalization == "none" and data.size and (data.min() < 0 or data.max() > 1):
        raise InputError(
            "",
            "'{path}' has intensities in [{lo:g}, {hi:g}], outside the [0, 1] the model expects; "
            "use the default normalisation ('robust') instead of 'none'",
            "volume",
            path=volume.path,
            lo=data.min(),
            hi=data.max(),
        )
    return torch.from_numpy(np.ascontiguousarray(data))[None, None].to(device)


@dataclass(frozen=True)
class NetworkGrid:
    """The grid a model's network runs on for a pair, when it is not the fixed grid.

    A model trained at a voxel size (:attr:`hyperreg.config.ModelConfig.spacing`, e.g. the 3D
    bundled model at 2 mm) sees every pair at that size, as SynthMorph conforms its inputs to
    the 1 mm grid it was trained on: the pair is resampled (linear, as in training) to
    isotropic voxels of that size on the fixed image's axes and origin
    (:func:`hyperreg.geometry.resample.isotropic_grid`), and the predicted displacement is
    brought back to the fixed grid (:meth:`to_fixed`) before anything is warped, so every
    output is on the fixed grid at full resolution.

    Attributes:
        fixed: The fixed image (outputs are on its grid).
        grid: The network's grid (data: zeros).
    """

    fixed: Volume
    grid: Volume

    @property
    def ratio(self) -> np.ndarray:
        """Network voxel size / fixed voxel size, per array axis."""
        return np.asarray(self.grid.spacing) / np.asarray(self.fixed.spacing)

    def note(self) -> str:
        """One line for :attr:`RegistrationResult.resampled`."""
        return (
            f"registered at the model's {self.grid.spacing[0]:g} mm voxels "
            f"({describe_grid(self.grid)}); the field is brought back to the fixed grid "
            f"({describe_grid(self.fixed)})"
        )

    def to_fixed(self, field: torch.Tensor) -> torch.Tensor:
        """A field on the network grid as a field on the fixed grid.

        Fixed voxel ``p`` lies at network voxel ``q = M p + t`` (``M``, ``t`` from
        ``inv(grid.affine) @ fixed.affine``: a scaling when the grids share axes, a permutation
        and flips as well for a model that works in its own storage orientation); the field
        is interpolated there (linear, edge values beyond the last network voxel) and its
        vectors mapped to fixed voxels by ``inv(M)`` (a displacement of 1 network voxel along
        a network axis is that axis' step in fixed voxels).

        Args:
            field: ``(B, N, *S_net)`` displacement in network voxels, i/j/k order.

        Returns:
            ``(B, N, *S_fixed)`` displacement in fixed voxels, same dtype and device.
        """
        shape = tuple(self.fixed.spatial_shape)
        ndim = len(shape)
        voxel_map = np.linalg.inv(self.grid.affine) @ self.fixed.affine
        linear = torch.as_tensor(voxel_map[:ndim, :ndim], dtype=torch.float64, device=field.device)
        offset = torch.as_tensor(voxel_map[:ndim, 3], dtype=torch.float64, device=field.device)
        view = (1, -1) + (1,) * ndim
        work = torch.promote_types(field.dtype, torch.float32)
        back = torch.linalg.inv(linear).to(work)
        source = field.to(work)
        out = torch.empty((field.shape[0], ndim, *shape), dtype=field.dtype, device=field.device)
        # positions in float64, sampling in float32, one slab of fixed axis 0 at a time
        rows = max(1, _SLAB_VOXELS // max(int(np.prod(shape[1:])), 1))
        axes = [torch.arange(n, dtype=torch.float64, device=field.device) for n in shape]
        for start in range(0, shape[0], rows):
            cut = [axes[0][start : start + rows], *axes[1:]]
            points = torch.stack(torch.meshgrid(*cut, indexing="ij"))[None]
            points = torch.einsum("ij,bj...->bi...", linear, points) + offset.view(view)
            fine = sample_at(source, points, padding="border", exact=False)
            out[:, :, start : start + rows] = torch.einsum("ij,bj...->bi...", back, fine)
        return out


def network_grid(model: HyperMorph, fixed: Volume) -> NetworkGrid | None:
    """Where ``model`` registers a pair on ``fixed``'s grid: None for the fixed grid itself,
    else a :class:`NetworkGrid`.

    A model with a storage orientation (:attr:`~hyperreg.config.ModelConfig.orientation`, 3D)
    sees the pair on :func:`~hyperreg.geometry.resample.conformed_grid` of the fixed image (its
    axes permuted and flipped to that orientation, voxels of the model's size), so the same
    anatomy stored LIA or RAS is registered alike; otherwise a model with a voxel size sees
    isotropic voxels of that size on the fixed image's axes
    (:func:`~hyperreg.geometry.resample.isotropic_grid`)."""
    spacing = float(model.config.spacing)
    orientation = model.config.orientation
    if orientation and len(fixed.spatial_shape) == 3:
        grid = conformed_grid(fixed, spacing, orientation)
    else:
        grid = isotropic_grid(fixed, spacing) if spacing > 0 else None
    return None if grid is None else NetworkGrid(fixed, grid)


def network_inputs(
    model: HyperMorph,
    moving: Volume,
    fixed: Volume,
    normalization: str,
    device: torch.device,
    notes: list[str] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, NetworkGrid | None]:
    """The model's ``(moving, fixed)`` input tensors for a pair on the fixed grid.

    On the fixed grid itself, or resampled to the network's grid (:func:`network_grid`; a line
    saying so is appended to ``notes``). Shapes ``(1, 1, *S)``; intensities normalised after
    resampling (:func:`model_input`).

    Returns:
        ``(moving_t, fixed_t, grid)``: pass ``grid`` to :func:`result_from_output` so the field
        comes back to the fixed grid.
    """
    grid = network_grid(model, fixed)
    if grid is not None and notes is not None:
        notes.append(grid.note())
    target = None if grid is None else grid.grid
    with passed_as(volume="moving"):
        moving_t = network_tensor(moving, target, normalization, device, keep=True)
    with passed_as(volume="fixed"):
        fixed_t = network_tensor(fixed, target, normalization, device, keep=True)
    return moving_t, fixed_t, grid


_MADE: ContextVar[dict[tuple, tuple[Volume, torch.Tensor, int]] | None] = ContextVar(
    "hyperreg_network_tensors", default=None
)


@contextmanager
def reused_network_tensors(store: dict | None = None) -> Iterator[None]:
    """Within this block, the tensors :func:`network_inputs` makes (the pair's moving and fixed
    images on the network grid) are kept, and :func:`network_tensor` of the same volume (the
    same object), grid, normalisation and device returns them, unless changed in place since,
    instead of resampling and normalising again: a registration and its verdict bring the
    fixed image (and the moving image after the affine stage) to the network grid once.

    Args:
        store: Where they are kept (a pair's own dict, so that they last as long as the pair
            and can be made beforehand, :func:`network_tensor` with ``keep``); None: the
            enclosing block's, or a new one for this block. Kept volumes are held (their ids
            name them); other threads keep their own.
    """
    if store is None and _MADE.get() is not None:
        yield
        return
    token = _MADE.set({} if store is None else store)
    try:
        yield
    finally:
        _MADE.reset(token)


def network_tensor(
    volume: Volume,
    grid: Volume | None,
    normalization: str,
    device: torch.device,
    *,
    keep: bool = False,
) -> torch.Tensor:
    """``volume`` resampled (linear, through the headers) onto ``grid`` when given, then
    normalised (:func:`model_input`): ``(1, 1, *S)`` on ``device``. Inside
    :func:`reused_network_tensors`, the tensor kept for this volume, grid, normalisation and
    device when there is one, and with ``keep`` the one made is kept (only volumes that live
    as long as the pair: a kept volume is held).

    Raises:
        InputError: As :func:`model_input`.
    """
    made = _MADE.get()
    key = (id(volume), normalization, str(device))
    if grid is not None:
        key += (grid.spatial_shape, grid.affine.tobytes())
    if made is not None and key in made:
        _, tensor, version = made[key]
        if tensor._version == version:  # not changed in place since it was made
            return tensor
    data = volume if grid is None else resample_to(volume, grid)
    tensor = model_input(data, normalization, device)
    if made is not None and keep:  # the volume is held, so its id names it while kept
        made[key] = (volume, tensor, tensor._version)
    return tensor


def prepare_pair(
    fn: str,
    model: HyperMorph,
    moving: Volume,
    fixed: Volume,
    moving_seg: Volume | None,
    fixed_seg: Volume | None,
    *,
    resample: bool,
) -> tuple[Volume, Volume | None, Volume | None, list[str]]:
    """Check a pair against the model and bring every input onto the fixed grid.

    Returns ``(moving, moving_seg, fixed_seg, notes)`` on the fixed grid, with one note per input
    that was resampled. Raises as :func:`register_pair` documents.
    """
    if fixed.ndim != model.config.ndim:
        raise ValueError(
            f"{fn}(): the model is {model.config.ndim}D but '{fixed.path}' is "
            f"{fixed.ndim}D with shape {fixed.spatial_shape}"
        )
    if not resample:
        check_same_grid(moving, fixed)
        for seg, image in ((moving_seg, moving), (fixed_seg, fixed)):
            if seg is not None and not same_grid(seg, image):
                raise ValueError(
                    f"{fn}(): label map '{seg.path}' must lie on the grid of its image "
                    f"'{image.path}', got {describe_grid(seg)} vs {describe_grid(image)}; "
                    "resample it first (resample=True)"
                )
    (moving, moving_seg, fixed_seg), notes = onto_fixed_grid(
        fn, fixed, moving, moving_seg, fixed_seg, resample=resample
    )
    assert moving is not None  # given, so returned
    return moving, moving_seg, fixed_seg, notes


def onto_fixed_grid(
    fn: str,
    fixed: Volume,
    moving: Volume | None,
    moving_seg: Volume | None,
    fixed_seg: Volume | None,
    *,
    resample: bool,
) -> tuple[tuple[Volume | None, Volume | None, Volume | None], list[str]]:
    """The moving image, moving label map and fixed label map (each None or a Volume) on
    ``fixed``'s grid (:func:`onto_grid`), and one note per volume that was resampled."""
    roles = (("moving", False), ("moving label map", True), ("fixed label map", True))
    out: list[Volume | None] = []
    notes: list[str] = []
    for volume, (role, label) in zip((moving, moving_seg, fixed_seg), roles):
        if volume is not None:
            volume, note = onto_grid(fn, volume, fixed, role, label=label, resample=resample)
            notes += [note] if note else []
        out.append(volume)
    return (out[0], out[1], out[2]), notes


def result_from_output(
    out: RegistrationOutput,
    index: int,
    lam: float,
    moving_seg: Volume | None,
    fixed_seg: Volume | None,
    notes: list[str],
    labels: Sequence[int] | None = None,
    moving: Volume | None = None,
    grid: NetworkGrid | None = None,
    images: bool = True,
) -> RegistrationResult:
    """The :class:`RegistrationResult` of sample ``index`` of a model output (fixed grid).

    With ``moving`` (on the fixed grid), ``moved`` is ``moving`` warped in its own intensity
    units, as ANTs and VoxelMorph write it; otherwise the model's normalised moved image (which
    needs ``grid`` None). With ``grid`` (from :func:`network_inputs`), the displacement is
    brought from the network's grid to the fixed grid first. ``images=False`` returns the field
    and its statistics only (``moved`` and ``moved_seg`` None, no Dice): for a caller that
    samples the original files through an affine + field chain itself.
    """
    release_freed_memory()  # what the network and refinement freed, before full-size arrays
    disp = out.disp[index : index + 1].float()
    if grid is not None:
        if moving is None and images:
            raise ValueError(
                "result_from_output(): a field on a network grid needs 'moving' to warp"
            )
        disp = grid.to_fixed(disp)
        release_freed_memory()  # the resampling's temporaries, before the Jacobian's
    moved = moved_seg = None
    if images and moving is not None:
        raw = torch.from_numpy(moving.data.astype(np.float32))[None, None].to(disp.device)
        moved = warp(raw, disp, padding="itk")[0, 0].cpu().numpy()  # as ITK writes it
    elif images:
        moved = out.moved[index, 0].float().cpu().numpy()
    if images and moving_seg is not None:
        seg = torch.from_numpy(moving_seg.data.astype(np.float32))[None, None].to(disp.device)
        moved_seg = warp(seg, disp, mode="nearest", padding="zeros").round().to(torch.int32)
        moved_seg = moved_seg[0, 0].cpu().numpy()
    # one Jacobian for both statistics (field_summary computes it once per statistic); the
    # same formulas as metrics.folding_fraction and metrics.log_jacobian_std
    det = jacobian_determinant(disp.float())
    release_freed_memory()  # the Jacobian's temporaries, before the statistics'
    summary = {
        "folding_fraction": float((det <= 0).float().mean()),
        "log_jacobian_std": float(det.clamp_min_(1e-9).log_().std()),  # in place: no copies
    }
    del det
    dice = None
    if moved_seg is not None and fixed_seg is not None:
        dice = registration_dice(moved_seg, fixed_seg.data, moving_seg.data, labels)
    return RegistrationResult(
        moved=moved,
        disp=disp[0].cpu().numpy(),
        moved_seg=moved_seg,
        lam=lam,
        dice=dice,
        folding_fraction=summary["folding_fraction"],
        log_jacobian_std=summary["log_jacobian_std"],
        resampled=list(notes),
    )


def smoothness_of(model: HyperMorph, out: RegistrationOutput) -> torch.Tensor:
    """``(B,)`` the smoothness term of the model's objective for each field of ``out``: Grad-l2
    of the velocity (the displacement for a model without integration), in voxels², times
    ``int_downsize`` for a half-resolution velocity, as in training
    (:meth:`hyperreg.method.objective.Objective.smoothness`)."""
    field = out.velocity if out.velocity is not None else out.disp
    return model.objective.smoothness(field.float(), tuple(out.disp.shape[2:])).detach()


def check_outputs(
    fn: str, inputs: Sequence[PathLike | None] = (), **outputs: PathLike | None
) -> None:
    """Check output paths before any work: suffix (displacement fields, named in
    :data:`FIELD_OUTPUTS`: NIfTI; images and label maps: NIfTI or MGZ), distinct, not an
    input, folder writable.

    The nearest existing folder of each output is probed by creating (and removing) a temporary
    file in it, so a folder that reports itself writable but is not (``/proc``, a read-only
    mount) fails here, naming the argument, not after the registration. A folder that does not
    exist yet is created when the output is written (the command line says so).

    Raises:
        InputError (a ValueError): naming the output argument in ``argument``.
    """
    sources = {Path(p).resolve() for p in inputs if p is not None}
    seen: dict[Path, str] = {}
    for name, out in outputs.items():
        if out is None:
            continue
        ends = OUTPUT_SUFFIXES if name in FIELD_OUTPUTS else VOLUME_SAVE_SUFFIXES
        if not str(out).lower().endswith(ends):
            raise InputError(fn, "{0} must end in {ends}, got '{out}'", name, ends=ends, out=out)
        path = Path(out).resolve()
        if path in seen:
            raise InputError(
                fn,
                "{0} and {1} are the same file '{out}'; give each output its own path",
                name,
                seen[path],
                out=out,
            )
        if path in sources:
            raise InputError(
                fn, "{0} would overwrite the input '{out}'; choose another path", name, out=out
            )
        if path.is_dir():
            raise InputError(fn, "{0} is a folder, not a file: '{out}'", name, out=out)
        _check_folder(fn, name, out, path.parent)
        seen[path] = name


def _check_folder(fn: str, name: str, out: PathLike, parent: Path) -> None:
    """The nearest existing folder of ``parent`` takes a new file (probed), else InputError."""
    folder = parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        message = "cannot write '{out}': '{folder}' is a file, not a folder"
        raise InputError(fn, message, name, out=out, folder=folder)
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".hyperreg-probe-"):
            pass
    except OSError as err:
        message = "cannot write '{out}': folder '{folder}' does not take new files ({reason})"
        if folder != parent:  # the output's own folder is missing and cannot be made there
            message = (
                "cannot write '{out}': its folder '{parent}' is missing and cannot be created, "
                "as '{folder}' does not take new files ({reason})"
            )
        reason = err.strerror or err
        raise InputError(
            fn, message, name, out=out, folder=folder, parent=parent, reason=reason
        ) from err
