"""The files one registration writes, as one typed record (:class:`OutputSpec`) and one writer.

:class:`OutputSpec` holds every output path of a registration (None: not written) and the
displacement format; :func:`write_outputs` writes a :class:`~hyperreg.registration.results.
PairResult` through it, each file atomically (a temporary file and a rename), side by side on
threads, the first error raised after every write has ended. ``register`` (and so each pair of
``batch``), ``sweep`` (per λ) and the viewer's Save write through it.

Adding an output kind touches two files: here, a field of :class:`OutputSpec` and its entry in
``WRITERS`` (a function ``(path, result, pair, spec) -> callable``), and the CLI module that
offers its option. :func:`write_outputs` iterates over the spec's fields, so nothing else
changes; every path field must have a writer (checked on every write). Must not import cli.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import torch

from hyperreg._checks import check_option
from hyperreg.apps.transforms import check_transform_path
from hyperreg.geometry.affine import AffineTransform, save_affine
from hyperreg.geometry.fields import DISPLACEMENT_FORMATS, check_itk_grid, save_displacement
from hyperreg.geometry.io import save_volume
from hyperreg.registration.memory import release_freed_memory
from hyperreg.registration.pairs import PathLike, check_outputs
from hyperreg.registration.pipeline import PairResult, PreparedPair

__all__ = ["OPTIONS", "TRANSFORMS", "WRITERS", "OutputSpec", "write_outputs"]

Writer = Callable[[PathLike, PairResult, PreparedPair, Any], Callable[[], object] | None]

OPTIONS = ("warp_format",)
"""Fields of :class:`OutputSpec` that are settings of the writers, not outputs."""

TRANSFORMS = ("affine_out",)
"""Output fields written as ITK transform files; the others are images and fields (NIfTI/MGZ)."""


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """Where one registration's outputs go (None: not written), and how fields are stored.

    Attributes:
        moved: Moved image (fixed grid and affine).
        warp_out: Displacement of the whole transform, affine and field (fixed grid).
        moved_seg: Moved label map (fixed grid, integer, nearest neighbour).
        inverse_warp_out: Inverse of the whole transform (the moving grid when the pair needs
            a chain, else the fixed grid).
        affine_out: The affine stage as an ITK transform file (``.mat``, ``.tfm``, ``.txt``).
        field_out: The deformable field alone (fixed grid).
        warp_format: ``"voxel"`` or ``"itk"`` for the displacement fields.
    """

    moved: PathLike | None = None
    warp_out: PathLike | None = None
    moved_seg: PathLike | None = None
    inverse_warp_out: PathLike | None = None
    affine_out: PathLike | None = None
    field_out: PathLike | None = None
    warp_format: str = "voxel"

    @classmethod
    def from_args(cls, args: Any) -> OutputSpec:
        """The spec from an ``argparse`` namespace (attributes named as the fields; a missing
        attribute is the field's default)."""
        given = {
            f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)
        }
        return cls(**{k: v for k, v in given.items() if v is not None})

    def paths(self) -> dict[str, PathLike | None]:
        """``{field: path}`` of every output field, in field order (None: not written)."""
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in OPTIONS
        }

    def given(self) -> list[PathLike]:
        """The paths to be written, in field order."""
        return [path for path in self.paths().values() if path is not None]

    def check(self, fn: str, inputs: Sequence[PathLike | None] = ()) -> None:
        """Check the spec before any work: a known ``warp_format``; image and field outputs
        (suffix, distinct, no input overwritten, a folder that takes files:
        :func:`~hyperreg.registration.pairs.check_outputs`); transform files (suffix).

        Raises:
            InputError: Naming the field (``fn`` the public function named).
        """
        check_option(fn, "warp_format", self.warp_format, DISPLACEMENT_FORMATS)
        paths = self.paths()
        check_outputs(fn, inputs, **{k: v for k, v in paths.items() if k not in TRANSFORMS})
        for name in TRANSFORMS:
            check_transform_path(fn, name, paths[name])


def _moved(path: PathLike, result: PairResult, pair: PreparedPair, spec: OutputSpec):
    return partial(save_volume, path, result.moved, pair.fixed)


def _moved_seg(path: PathLike, result: PairResult, pair: PreparedPair, spec: OutputSpec):
    if result.moved_seg is None:
        return None
    return partial(save_volume, path, result.moved_seg, pair.fixed, label=True)


def _warp(path: PathLike, result: PairResult, pair: PreparedPair, spec: OutputSpec):
    return partial(save_displacement, path, result.warp, pair.fixed, format=spec.warp_format)


def _field(path: PathLike, result: PairResult, pair: PreparedPair, spec: OutputSpec):
    return partial(save_displacement, path, result.disp, pair.fixed, format=spec.warp_format)


def _inverse(path: PathLike, result: PairResult, pair: PreparedPair, spec: OutputSpec):
    if result.inverse_disp is None:
        return None
    grid = pair.moving if pair.chained else pair.fixed  # the inverse chain's grid
    if spec.warp_format == "itk":
        check_itk_grid(grid)  # before any file is written
    return partial(save_displacement, path, result.inverse_disp, grid, format=spec.warp_format)


def _affine(path: PathLike, result: PairResult, pair: PreparedPair, spec: OutputSpec):
    headers = result.verdict is not None and result.verdict.kept == "headers"
    transform = AffineTransform.identity() if headers else pair.transform  # as it came: identity
    return partial(save_affine, path, transform, pair.fixed.ndim)


WRITERS: dict[str, Writer] = {
    "moved": _moved,
    "warp_out": _warp,
    "moved_seg": _moved_seg,
    "inverse_warp_out": _inverse,
    "field_out": _field,
    "affine_out": _affine,
}
"""The writer of each output field of :class:`OutputSpec`: ``(path, result, pair, spec)`` ->
a callable that writes the file atomically, or None when the result has nothing for it."""


def write_outputs(spec: OutputSpec, result: PairResult, pair: PreparedPair) -> None:
    """Write every output of ``spec`` that is given, each atomically, on as many threads as
    torch is given (``torch.get_num_threads()``: the user's thread count; gzip compression of a
    3D field dominates and zlib releases the GIL while it compresses).

    Raises:
        KeyError: If a path field of ``spec`` has no entry in ``WRITERS`` (a programming error).
        Whatever a writer raises (ValueError, OSError), the first one, after every write ended.
    """
    release_freed_memory()  # what registering freed, before the writers' buffers
    jobs: list[Callable[[], object]] = []
    for name, path in spec.paths().items():
        writer = WRITERS[name]
        job = None if path is None else writer(path, result, pair, spec)
        if job is not None:
            jobs.append(job)
    workers = min(len(jobs), torch.get_num_threads())
    if workers <= 1:
        for job in jobs:
            job()
        return
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(job) for job in jobs]
    for future in futures:
        future.result()  # re-raises the first failure
