"""The page of the λ explorer, and the self-contained sweep page (``hyperreg sweep --html``).

:func:`static_file` reads the bundled files of ``view_static`` (the page template, its script
and NiiVue, whose licence is ``view_static/NIIVUE_LICENSE``); :func:`page_html` fills the
template. :func:`write_sweep_page` writes one HTML file that needs no server and no network: NiiVue
and the page script inlined, every swept λ's numbers and volumes embedded (gzip NIfTI in
base64; 3D volumes kept at about 2 mm and every image as 8-bit grey levels,
:mod:`hyperreg.apps.view_volumes`). Must not import the server or cli.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from hyperreg._errors import InputError
from hyperreg._files import atomic_write
from hyperreg.apps.view_results import readout
from hyperreg.apps.view_volumes import (
    JACOBIAN_SCALE,
    display_volumes,
    edges_nd,
    nifti_bytes,
    plane_of,
    to_uint8,
)
from hyperreg.registration.pairs import PathLike
from hyperreg.registration.pipeline import PairResult, PreparedPair

__all__ = [
    "PAGE_SPACING_MM",
    "check_page_path",
    "page_html",
    "static_file",
    "sweep_page_stride",
    "write_sweep_page",
]

PAGE_SPACING_MM = 2.0
"""3D volumes on the sweep page keep every n-th voxel along each axis, n the nearest integer
to this spacing over the fixed image's (so 1 mm images are stored at 2 mm)."""

_FILES = ("page.html", "view.js", "niivue.umd.js")


def static_file(name: str) -> bytes:
    """The bytes of one bundled page file (``page.html``, ``view.js`` or ``niivue.umd.js``).

    Raises:
        KeyError: If ``name`` is not one of them.
    """
    if name not in _FILES:
        raise KeyError(name)
    return resources.files("hyperreg.apps").joinpath("view_static", name).read_bytes()


def page_html(head: str, body_end: str = "") -> str:
    """The page template with ``head`` (script tags or inlined scripts) and ``body_end``."""
    template = static_file("page.html").decode("utf-8")
    return template.replace("<!--HEAD-->", head).replace("<!--BODY_END-->", body_end)


def _inline(script: str) -> str:
    return "<script>" + script.replace("</script", "<\\/script") + "</script>"


def check_page_path(fn: str, path: PathLike | None) -> None:
    """``path`` (the page to write) is None or ends in ``.html``/``.htm``.

    Raises:
        InputError: Otherwise (argument ``html``).
    """
    if path is not None and not str(path).lower().endswith((".html", ".htm")):
        raise InputError(fn, "{0} must end in .html, got '{path}'", "html", path=path)


def sweep_page_stride(affine: np.ndarray, ndim: int) -> tuple[int, ...]:
    """Voxel step per axis of the sweep page's volumes: 1 in 2D; in 3D the nearest integer to
    :data:`PAGE_SPACING_MM` over the axis's spacing (at least 1)."""
    if ndim == 2:
        return (1, 1)
    spacing = np.linalg.norm(np.asarray(affine)[:3, :3], axis=0)
    return tuple(max(1, round(float(PAGE_SPACING_MM / s))) for s in spacing)


def write_sweep_page(
    path: PathLike, pair: PreparedPair, results: Sequence[PairResult], lam: float | None = None
) -> Path:
    """Write the self-contained sweep page: a λ slider over the swept λ, the readouts and
    curves of :mod:`hyperreg.apps.view`, and per λ the moved image, |difference|, Jacobian
    determinant and folding voxels, over the fixed and moving images and fixed-image edges.

    Args:
        path: Output HTML file (written atomically).
        pair: The swept pair.
        results: One result per λ (any order; the page sorts them by λ).
        lam: λ the slider starts at (the nearest swept one); None: the middle one.

    Returns:
        ``path``.
    """
    ordered = sorted(results, key=lambda r: r.lam)
    fixed = pair.fixed
    stride = sweep_page_stride(fixed.affine, fixed.ndim)
    moving_range = (float(pair.aligned.data.min()), float(pair.aligned.data.max()))
    fixed_range = (float(fixed.data.min()), float(fixed.data.max()))

    def encode(data: np.ndarray, cal: tuple[float, float], slope: float = 1.0) -> str:
        raw = nifti_bytes(data, fixed.affine, cal=cal, slope=slope, compress=True, stride=stride)
        return base64.b64encode(raw).decode("ascii")

    volumes: dict[str, object] = {
        "fixed": encode(to_uint8(fixed.data, *fixed_range), (0, 255)),
        "moving": encode(to_uint8(pair.aligned.data, *moving_range), (0, 255)),
        "edges": encode(edges_nd(fixed.data).astype(np.uint8), (0, 1)),
    }
    cal = {"moved": (0, 255), "diff": (0, 128), "jac": (0, 2), "fold": (0, 1)}
    per_lam: dict[str, list[str]] = {kind: [] for kind in cal}
    for r in ordered:
        views = display_volumes(
            r.moved,
            fixed.data,
            r.disp,
            moving_range=moving_range,
            fixed_range=fixed_range,
            kinds=tuple(cal),
        )
        for kind, data in views.items():
            slope = JACOBIAN_SCALE if kind == "jac" else 1.0
            per_lam[kind].append(encode(data, cal[kind], slope))
    volumes.update(per_lam)
    grid = [float(r.lam) for r in ordered]
    start = grid[(len(grid) - 1) // 2] if lam is None else min(grid, key=lambda v: abs(v - lam))
    names = [Path(str(v.path)).name if v.path else "" for v in (pair.moving, pair.fixed)]
    data = {
        "info": {
            "ndim": fixed.ndim,
            "shape": list(fixed.data.shape),
            "plane": plane_of(fixed.affine) if fixed.ndim == 2 else None,
            "lam": start,
            "grid": grid,
            "labels": pair.labels,
            "has_labels": False,  # label maps are not embedded: no contours here
            "dice_before": pair.dice_before,
            "dice_affine": pair.dice_affine,
            "moving": names[0],
            "fixed": names[1],
            "refine": "",
            "out": "",
        },
        "points": [readout(r) for r in ordered],
        "volumes": volumes,
    }
    head = (
        _inline(static_file("niivue.umd.js").decode("utf-8"))
        + _inline("window.HYPERREG_EMBEDDED = " + json.dumps(data) + ";")
        + _inline(static_file("view.js").decode("utf-8"))
    )
    html = page_html(head)
    return atomic_write(path, lambda tmp: tmp.write_text(html, encoding="utf-8"))
