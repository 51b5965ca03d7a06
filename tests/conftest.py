"""Shared pytest fixtures: seeding, tiny synthetic images and analytic fields; the skip summary.

Skipped tests are summed up at the end (:func:`pytest_terminal_summary`): those that need the
shared brain MRI data or the bad-input cases (absent in a fresh clone) in one line saying where
they look and which variable to set, the others one line per reason with its count.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

# Command-line tests start Python subprocesses: one thread each too, as the tests themselves run
# (pytest-xdist runs one test per core; a subprocess with a thread per core would oversubscribe).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
from shared_paths import CASES, DATA
from torch import Tensor

# Tiny, deliberately non-cubic grids: sizes differ per axis so that any axis mix-up shows.
SHAPES: dict[int, tuple[int, ...]] = {2: (16, 20), 3: (8, 10, 12)}


@pytest.fixture(autouse=True, scope="session")
def _single_thread() -> Iterator[None]:
    """Run torch on one intra-op thread: the test tensors are tiny, and thread start-up and
    contention then cost far more than they save (10-100x slower on a 2-core runner)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Every test starts from the same random state."""
    torch.manual_seed(0)


@pytest.fixture(params=[2, 3], ids=["2d", "3d"])
def ndim(request: pytest.FixtureRequest) -> int:
    """Number of spatial dimensions."""
    return int(request.param)


@pytest.fixture
def shape(ndim: int) -> tuple[int, ...]:
    """A small non-cubic spatial shape for ``ndim``."""
    return SHAPES[ndim]


def gaussian_blobs(
    spatial_shape: Sequence[int],
    batch: int = 1,
    num_blobs: int = 4,
    sigma: float = 2.0,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Sum of random isotropic Gaussian blobs in [0, 1], shape ``(batch, 1, *spatial_shape)``."""
    ndim = len(spatial_shape)
    axes = [torch.arange(s, dtype=torch.float64) for s in spatial_shape]
    coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=0)  # (N, *S)
    size = torch.tensor(spatial_shape, dtype=torch.float64).view(ndim, *([1] * ndim))
    images = []
    for _ in range(batch):
        image = torch.zeros(spatial_shape, dtype=torch.float64)
        for _ in range(num_blobs):
            centre = torch.rand(ndim, *([1] * ndim), dtype=torch.float64) * (size - 1)
            dist2 = ((coords - centre) ** 2).sum(0)
            image = image + torch.rand((), dtype=torch.float64) * torch.exp(-dist2 / (2 * sigma**2))
        images.append(image / image.max())
    return torch.stack(images, 0).unsqueeze(1).to(dtype)


@pytest.fixture
def make_blobs() -> Callable[..., Tensor]:
    """Factory for Gaussian-blob images, see :func:`gaussian_blobs`."""
    return gaussian_blobs


@pytest.fixture
def make_texture() -> Callable[..., Tensor]:
    """Factory for textured images: uniform noise plus blobs, ``(batch, 1, *S)`` in [0, 1]."""

    def make(
        spatial_shape: Sequence[int], batch: int = 1, dtype: torch.dtype = torch.float32
    ) -> Tensor:
        noise = torch.rand(batch, 1, *spatial_shape, dtype=torch.float64)
        image = 0.5 * noise + 0.5 * gaussian_blobs(spatial_shape, batch, dtype=torch.float64)
        return image.to(dtype)

    return make


def constant_field(spatial_shape: Sequence[int], values: Sequence[float], batch: int = 1) -> Tensor:
    """Field ``(batch, N, *S)`` whose channel ``n`` is the constant ``values[n]``."""
    ndim = len(spatial_shape)
    vec = torch.tensor(values, dtype=torch.float32).view(1, ndim, *([1] * ndim))
    return vec.expand(batch, ndim, *spatial_shape).clone()


def linear_field(matrix: Tensor, spatial_shape: Sequence[int]) -> Tensor:
    """Displacement ``disp(x) = (A - I) x`` of the linear map ``x -> A x``, shape ``(1, N, *S)``."""
    ndim = len(spatial_shape)
    axes = [torch.arange(s, dtype=matrix.dtype) for s in spatial_shape]
    coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=0)  # (N, *S)
    delta = matrix - torch.eye(ndim, dtype=matrix.dtype)
    return torch.einsum("ca,a...->c...", delta, coords).unsqueeze(0)


@pytest.fixture
def make_constant_field() -> Callable[..., Tensor]:
    """Factory for constant (translation) fields, see :func:`constant_field`."""
    return constant_field


@pytest.fixture
def make_linear_field() -> Callable[..., Tensor]:
    """Factory for linear displacement fields, see :func:`linear_field`."""
    return linear_field


@pytest.fixture
def make_fold() -> Callable[[Sequence[int], int], Tensor]:
    """Factory for a planted fold: the map reflects array axis 0 about row ``c``.

    ``phi_0(x) = x_0`` for ``x_0 <= c`` and ``2c - x_0`` beyond, other axes unchanged, so with
    ``torch.gradient`` differences ``J = 1`` for rows ``< c``, ``J = 0`` at row ``c`` and
    ``J = -1`` for rows ``> c``.
    """

    def make(spatial_shape: Sequence[int], c: int) -> Tensor:
        ndim = len(spatial_shape)
        disp = torch.zeros(1, ndim, *spatial_shape)
        rows = torch.arange(spatial_shape[0], dtype=torch.float32)
        u0 = torch.where(rows > c, 2.0 * (c - rows), torch.zeros_like(rows))
        disp[:, 0] = u0.view(-1, *([1] * (ndim - 1)))
        return disp

    return make


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """After the run: the skipped tests summed up, instead of one ``SKIPPED`` line each
    (``addopts`` lists failures and errors only, ``-rfE``). Tests that need the shared data or
    cases (:mod:`shared_paths`) are one line; any other skip reason is one line with its count.
    They stay skips (pytest's own count at the end says so)."""
    reports = terminalreporter.stats.get("skipped", [])
    reasons: dict[str, int] = {}
    shared = 0
    for report in reports:
        reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else "")
        reason = reason.removeprefix("Skipped: ")
        if str(DATA) in reason or str(CASES) in reason:
            shared += 1
        else:
            reasons[reason] = reasons.get(reason, 0) + 1
    if not reports:
        return
    terminalreporter.write_sep("=", f"{len(reports)} skipped")
    if shared:
        absent = [
            f"{path} ({variable})"
            for path, variable in ((DATA, "HYPERREG_DATA"), (CASES, "HYPERREG_CASES"))
            if not path.is_dir()
        ]
        where = " and ".join(absent) or f"{DATA} or {CASES}"
        terminalreporter.write_line(
            f"{shared} test(s) read brain MRI scans or bad-input cases that are not at {where}; "
            "set the variable to a copy of that folder to run them (tests/shared_paths.py)"
        )
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{count} test(s): {reason}")
