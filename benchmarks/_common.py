"""Helpers shared by the benchmark scripts (not part of the hyperreg package).

Contract every ``bench_*.py`` follows, so that ``run_all.py`` can stitch RESULTS.md together:

* ``main(argv) -> int``; stdout carries only the script's Markdown section body (prose, tables,
  the verdict against DESIGN.md §5); progress and logs go to stderr (:func:`log`).
* Plots are written where ``--plot-dir`` says (PNG, matplotlib's Agg backend).
* Data comes from ``--data`` (default: the neurite-oasis folder of ``../shared/data`` beside the
  repository), never from a hard-coded absolute path.
"""

from __future__ import annotations

import sys
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = Path(os.environ.get("HYPERREG_DATA") or REPO.parent / "shared" / "data")
DEFAULT_DATA = DATA_ROOT / "neurite-oasis"
DEFAULT_PLOTS = REPO / "benchmarks" / "plots"
MOVING = "OASIS_OAS1_0002_MR1"
FIXED = "OASIS_OAS1_0001_MR1"


def log(*parts: object) -> None:
    """Progress message to stderr (stdout is reserved for the Markdown section)."""
    print(*parts, file=sys.stderr, flush=True)


def shape(text: str) -> tuple[int, ...]:
    """``"160x192"`` → ``(160, 192)``."""
    return tuple(int(s) for s in text.split("x"))


def verdict(ok: bool) -> str:
    """The word every table uses against a DESIGN.md §5 target."""
    return "met" if ok else "MISSED"


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; floats are written as given (format them before)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def synchronize(device: object) -> None:
    """Wait for queued CUDA work so wall-clock times are real; no-op on CPU."""
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)


def wall_time(fn: Callable[[], object], device="cpu") -> float:
    """Wall time (s) of one call of ``fn``, with CUDA work synchronised before and after."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def require_data(data: Path, *names: str) -> None:
    """Exit with a one-line message when the shared OASIS files are missing."""
    missing = [str(data / name) for name in names if not (data / name).exists()]
    if missing:
        raise SystemExit(f"benchmark needs the shared OASIS data; missing: {', '.join(missing)}")


def pyplot():
    """matplotlib's pyplot with the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
