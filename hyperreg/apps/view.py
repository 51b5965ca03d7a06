"""The λ explorer behind ``hyperreg view``: one pair, registered at whatever λ the page asks for.

:func:`open_view` prepares a pair **once** (:func:`hyperreg.registration.pipeline.load_pair`,
the affine stage included) and returns a :class:`ViewSession`, which registers it on demand
with :meth:`~hyperreg.registration.pipeline.PreparedPair.register` (the network alone, or
refined with the model's default steps), keeps the latest results in a bounded cache, fills
the curves against λ with a background sweep, builds the browser's volumes
(:mod:`hyperreg.apps.view_volumes`) and saves a λ's outputs with
:func:`hyperreg.apps.outputs.write_outputs`, as ``hyperreg register`` writes them. Only one
registration runs at a time (a lock); a λ the page asks for goes before the background sweep.
The HTTP side is :mod:`hyperreg.apps.view_server`. Must not import train or cli.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from hyperreg._checks import check_option
from hyperreg._errors import InputError
from hyperreg.apps.models import model_default_lambda, model_default_refine, pair_refinement
from hyperreg.apps.outputs import OutputSpec, write_outputs
from hyperreg.apps.view_results import Superseded, check_view_lam, network_text, readout
from hyperreg.apps.view_volumes import display_volumes, encode_views, plane_of, static_view
from hyperreg.geometry.intensity import DEFAULT_NORMALIZATION
from hyperreg.method.model import HyperMorph
from hyperreg.registration.contrast import CONTRAST_CHOICES, contrast_lambda, contrast_similarity
from hyperreg.registration.pairs import PathLike, check_outputs
from hyperreg.registration.pipeline import DEFAULT_INIT, PairResult, PreparedPair, load_pair
from hyperreg.registration.refine import Refinement

__all__ = [
    "DEFAULT_GRID",
    "VOLUME_KINDS",
    "Superseded",
    "ViewSession",
    "open_view",
    "readout",
]

logger = logging.getLogger(__name__)

DEFAULT_GRID = tuple(round(0.1 * i, 10) for i in range(11))
"""λ values of the background sweep that fills the curves (0, 0.1, …, 1)."""

VOLUME_KINDS = ("fixed", "moving", "edges", "moved", "checker", "diff", "jac", "fold", "contours")
"""Volumes the page may ask for: the first three do not depend on λ."""

_STATIC_KINDS = ("fixed", "moving", "edges")

SWEEP_IDLE_S = 2.0
"""Seconds without a request from the page before the background sweep starts its next λ (a
registration running cannot be stopped: a new λ would share the CPU with it)."""


@dataclass
class _Entry:
    result: PairResult
    numbers: dict[str, Any]
    volumes: dict[str, bytes] = field(default_factory=dict)


class ViewSession:
    """One prepared pair and a model, registered at any λ on request (thread-safe).

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph` of the pair's ndim.
        pair: The pair, from :func:`~hyperreg.registration.pipeline.load_pair`.
        out: Folder :meth:`save` writes into (created when saving).
        grid: λ values of the background sweep (:meth:`start_sweep`).
        cache_size: Registrations kept (least recently used dropped first); None: 32 in 2D,
            6 in 3D.
        lam: λ the page starts at; None: the model's default
            (:func:`hyperreg.apps.models.model_default_lambda`), raised as ``register`` raises
            it for other contrasts (:func:`~hyperreg.registration.contrast.contrast_lambda`).
        preview: Answer a new λ first with a preview (one network pass, no flip averaging,
            no verdict, no NCC), the model's full result next (the page swaps it in); None:
            only in 3D when the model runs more than one forward pass per λ. The curves, Save
            and refine always use the full settings. Previews have their own lock: a new λ's
            preview does not wait for a full registration running (they share the CPU).
        similarity: The verdict's similarity for the pair, as ``register`` judges it
            (:func:`~hyperreg.registration.contrast.contrast_similarity`); None: the model's.
    """

    def __init__(
        self,
        model: HyperMorph,
        pair: PreparedPair,
        out: PathLike,
        *,
        grid: Sequence[float] = DEFAULT_GRID,
        cache_size: int | None = None,
        lam: float | None = None,
        preview: bool | None = None,
        similarity: str | None = None,
    ) -> None:
        self.model, self.pair, self.similarity = model, pair, similarity
        self.out = Path(out)
        self.grid = [float(v) for v in grid]
        default = model_default_lambda(model).lam
        self.lam = float(contrast_lambda(default, similarity) or default if lam is None else lam)
        self.cache_size = cache_size or (32 if pair.fixed.ndim == 2 else 6)
        full_forwards = model.config.passes * (2 if model.config.flip_average else 1)
        self.preview = bool(
            pair.fixed.ndim == 3 and full_forwards > 1 if preview is None else preview
        )
        self._preview_model: HyperMorph | None = None
        self._cache: OrderedDict[tuple[float, bool, bool], _Entry] = OrderedDict()
        self._curves: dict[float, dict[str, Any]] = {}
        self._cache_lock = threading.Lock()
        self._work_lock = threading.Lock()  # one full registration at a time
        self._preview_lock = threading.Lock()  # one preview at a time
        self._asked = 0  # requests from the page waiting for the work lock
        self._last_asked = -math.inf  # time.monotonic() of the page's latest request or answer
        self._ticket = 0  # the newest page_result request
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        moving = pair.aligned.data
        self._moving_range = (float(moving.min()), float(moving.max()))
        fixed = pair.fixed.data
        self._fixed_range = (float(fixed.min()), float(fixed.max()))
        self._static: dict[str, bytes] = {}

    # ---------------------------------------------------------------------------- registering

    def result(self, lam: float | str, refined: bool = False) -> tuple[PairResult, dict[str, Any]]:
        """The registration at ``lam`` (cached) and its :func:`readout`.

        Raises:
            InputError: If ``lam`` is not a number in [0, 1].
        """
        key = (check_view_lam(lam), bool(refined), False)
        entry = self._entry(key, asked=True)
        return entry.result, entry.numbers

    def page_result(
        self, lam: float | str, refined: bool = False, preview: bool = False
    ) -> dict[str, Any]:
        """The :func:`readout` at ``lam`` for the page, newest request first: a request still
        waiting for the work lock when a newer one arrives is dropped (:class:`Superseded`)
        instead of registered, so dragging the slider through many λ queues at most the
        registration running and the last λ asked for.

        With ``preview`` (and :attr:`preview` on, not refined) the full result when it is
        cached, else the preview (``"preview": true`` in the readout).

        Raises:
            InputError: If ``lam`` is not a number in [0, 1].
            Superseded: If a newer request came before this one's registration started.
        """
        key = self._key(lam, refined, preview)
        with self._cache_lock:
            self._ticket += 1
            ticket = self._ticket
        return self._entry(key, asked=True, ticket=ticket).numbers

    def _key(self, lam: float | str, refined: bool, preview: bool) -> tuple[float, bool, bool]:
        """The cache key: a preview only when on, not refined and no full result is cached."""
        value = check_view_lam(lam)
        if not (preview and self.preview and not refined):
            return value, bool(refined), False
        with self._cache_lock:
            full = (value, False, False) in self._cache
        return value, False, not full

    def _entry(
        self, key: tuple[float, bool, bool], asked: bool, ticket: int | None = None
    ) -> _Entry:
        with self._cache_lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        if asked:
            with self._cache_lock:
                self._asked += 1
                self._last_asked = time.monotonic()
        try:
            with self._preview_lock if key[2] else self._work_lock:
                with self._cache_lock:  # another thread may have made it meanwhile
                    if key in self._cache:
                        return self._cache[key]
                    if ticket is not None and ticket != self._ticket:
                        raise Superseded(f"λ = {key[0]:g} was replaced by a newer request")
                start = time.perf_counter()
                lam, refined, preview = key
                result = self._preview(lam) if preview else self._register(lam, refined)
                entry = _Entry(result, readout(result, time.perf_counter() - start, key[2]))
                with self._cache_lock:  # stored before the next registration may start
                    self._cache[key] = entry
                    while len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
                    if not key[1] and not key[2]:
                        self._curves[key[0]] = entry.numbers
                return entry
        finally:
            if asked:
                with self._cache_lock:
                    self._asked -= 1
                    self._last_asked = time.monotonic()  # the page draws it now

    def _preview(self, lam: float) -> PairResult:
        # no verdict (and so no never-worse rule) and no NCC: the quickest honest look; the
        # full result that replaces it has both
        model = self.preview_model()
        options = dict(passes=1, judged=False, similarity=self.similarity)
        return self.pair.register(model, [lam], None, **options)[0]

    def _register(self, lam: float, refined: bool) -> PairResult:
        refinement = self.refinement() if refined else None
        options = dict(ncc=not refined, similarity=self.similarity)
        return self.pair.register(self.model, [lam], refinement, **options)[0]

    def preview_model(self) -> HyperMorph:
        """The model without flip averaging (the same weights, shared): the previews'."""
        if self._preview_model is None:
            quick = copy.copy(self.model)  # a shallow copy shares parameters and buffers
            quick.config = dataclasses.replace(self.model.config, flip_average=False)
            self._preview_model = quick
        return self._preview_model

    def refinement(self) -> Refinement:
        """The refinement of the page's refine action: the model's default steps
        (:func:`hyperreg.apps.models.pair_refinement`), or the library's default
        :class:`~hyperreg.registration.refine.Refinement` when the model records none."""
        return pair_refinement(self.model, None) or Refinement()

    def refine_text(self) -> str:
        """Where the refine action's steps come from (the model's card or the library)."""
        found = model_default_refine(self.model)
        steps = self.refinement().steps
        return f"{steps} steps ({'model default' if found.steps else 'library default'})"

    # ------------------------------------------------------------------------------ the sweep

    def start_sweep(self) -> None:
        """Register every λ of the grid in a background thread (network alone), one at a
        time, each once the page has had no request nor answer for :data:`SWEEP_IDLE_S`
        seconds (the page's λ go first); :meth:`curves` shows the progress. With
        :attr:`preview`, the first λ's preview and full result come first (warming the model)."""
        if self._sweeper is not None:
            return
        self._sweeper = threading.Thread(target=self._sweep, name="hyperreg-view-sweep")
        self._sweeper.daemon = True
        self._sweeper.start()

    def _sweep(self) -> None:
        keys = [(check_view_lam(lam), False, False) for lam in self.grid]
        if self.preview:  # warms the model: the page's first λ, preview then full, first
            start = check_view_lam(round(self.lam, 2))  # the page's slider: steps of 0.01
            keys = [(start, False, True), (start, False, False), *keys]
        for key in keys:
            while not self._stop.is_set() and (
                self._asked or time.monotonic() - self._last_asked < SWEEP_IDLE_S
            ):
                time.sleep(0.05)
            if self._stop.is_set():
                return
            try:
                self._entry(key, asked=False)
            except Exception:  # the page shows the curves it has; the log says why
                logger.exception("background sweep stopped at λ = %g", key[0])
                return

    def stop(self) -> None:
        """Stop the background sweep after the λ it is registering."""
        self._stop.set()
        if self._sweeper is not None:
            self._sweeper.join()

    def curves(self) -> dict[str, Any]:
        """``{"grid": [...], "points": [readout per λ done, sorted by λ], "done": bool}``;
        every network-alone registration so far counts, the grid's and the page's."""
        with self._cache_lock:
            points = [self._curves[k] for k in sorted(self._curves)]
        done = all(round(v, 6) in self._curves for v in self.grid)
        return {"grid": self.grid, "points": points, "done": done}

    # -------------------------------------------------------------------------------- volumes

    def volume(
        self,
        kind: str,
        lam: float | str | None = None,
        refined: bool = False,
        preview: bool = False,
    ) -> bytes:
        """The NIfTI bytes of one view (:data:`VOLUME_KINDS`) on the fixed grid, uint8.

        ``fixed``, ``moving`` (on the fixed grid, after the affine stage when one ran) and
        ``edges`` (of the fixed image) do not depend on λ; the others are those of
        :func:`hyperreg.apps.view_volumes.display_volumes` at ``lam``, built only when asked
        for (``jac`` and ``fold`` together, from one Jacobian), uncompressed (the page is
        local: gzip would cost more time than the transfer). With ``preview``: the preview's
        view when the page was given the preview (:meth:`page_result`).

        Raises:
            InputError: If ``kind`` is unknown, the pair has no label maps for
                ``"contours"``, or ``lam`` is missing or invalid for a λ-dependent view.
        """
        if kind not in VOLUME_KINDS:
            raise InputError("volume", "{0} must be one of {kinds}, got {kind!r}", "kind",
                             kinds=VOLUME_KINDS, kind=kind)  # fmt: skip
        affine = self.pair.fixed.affine
        if kind in _STATIC_KINDS:
            with self._cache_lock:
                if kind not in self._static:
                    moving, fixed = self.pair.aligned.data, self.pair.fixed.data
                    ranges = (self._moving_range, self._fixed_range)
                    self._static[kind] = static_view(kind, moving, fixed, affine, *ranges)
                return self._static[kind]
        if lam is None:
            raise InputError("volume", "{0} needs a λ", "kind")
        key = (check_view_lam(lam), bool(refined), True)
        with self._cache_lock:
            shown = preview and not refined and key in self._cache
        entry = self._entry(key if shown else self._key(lam, refined, preview), asked=True)
        with self._cache_lock:
            if kind in entry.volumes:
                return entry.volumes[kind]
        r = entry.result
        fixed_seg = self.pair.fixed_seg.data if self.pair.fixed_seg is not None else None
        views = display_volumes(
            r.moved,
            self.pair.fixed.data,
            r.disp,
            moving_range=self._moving_range,  # moved: the moving file's own intensities
            fixed_range=self._fixed_range,
            moved_seg=r.moved_seg,
            fixed_seg=fixed_seg,
            kinds=("jac", "fold") if kind in ("jac", "fold") else (kind,),
        )
        if kind not in views:
            raise InputError("volume", "{0} 'contours' needs both label maps", "kind")
        encoded = encode_views(views, affine)
        with self._cache_lock:
            entry.volumes.update(encoded)
        return encoded[kind]

    # ---------------------------------------------------------------------------------- info

    def info(self) -> dict[str, Any]:
        """What the page needs first: ``ndim``, ``shape``, ``plane`` (2D: the slice's
        anatomical plane), ``lam`` (start), ``grid``, ``labels``, ``has_labels``,
        ``dice_before``, ``dice_affine``, file names, ``refine`` (its steps), ``out``,
        ``preview`` (whether a new λ is answered with a preview first) and ``network`` (the
        full passes and flips, one line)."""
        pair = self.pair
        names = [Path(str(v.path)).name if v.path else "" for v in (pair.moving, pair.fixed)]
        return {
            "ndim": pair.fixed.ndim,
            "shape": list(pair.fixed.data.shape),
            "plane": plane_of(pair.fixed.affine) if pair.fixed.ndim == 2 else None,
            "lam": self.lam,
            "grid": self.grid,
            "labels": pair.labels,
            "has_labels": pair.labels is not None,
            "dice_before": pair.dice_before,
            "dice_affine": pair.dice_affine,
            "moving": names[0],
            "fixed": names[1],
            "refine": self.refine_text(),
            "out": str(self.out),
            "preview": self.preview,
            "network": network_text(self.model.config.passes, self.model.config.flip_average),
        }

    # ---------------------------------------------------------------------------------- save

    def save_paths(self, lam: float | str, refined: bool = False) -> dict[str, Path]:
        """The files :meth:`save` writes for ``lam``: ``moved_lam<λ>.nii.gz``,
        ``warp_lam<λ>.nii.gz`` and, with label maps, ``moved_seg_lam<λ>.nii.gz`` in
        :attr:`out` (``_refined`` before the suffix for a refined result)."""
        tag = f"lam{check_view_lam(lam):.10g}" + ("_refined" if refined else "")
        paths = {
            "moved": self.out / f"moved_{tag}.nii.gz",
            "warp_out": self.out / f"warp_{tag}.nii.gz",
        }
        if self.pair.moving_seg is not None:
            paths["moved_seg"] = self.out / f"moved_seg_{tag}.nii.gz"
        return paths

    def save(self, lam: float | str, refined: bool = False) -> list[Path]:
        """Write the moved image, the displacement field of the whole transform (voxel format)
        and the moved label map at ``lam`` with :func:`hyperreg.apps.outputs.write_outputs`,
        exactly as ``hyperreg register --moved --warp --moved-seg`` writes them.

        Returns:
            The paths written.

        Raises:
            InputError: If ``lam`` is invalid or an output path is unusable.
        """
        paths = self.save_paths(lam, refined)
        inputs = [v.path for v in (self.pair.moving, self.pair.fixed) if v.path is not None]
        check_outputs("ViewSession.save", inputs, **paths)
        result, _ = self.result(lam, refined)
        self.out.mkdir(parents=True, exist_ok=True)
        write_outputs(OutputSpec(**paths), result, self.pair)
        return list(paths.values())


def open_view(
    model: HyperMorph,
    moving: PathLike,
    fixed: PathLike,
    *,
    moving_seg: PathLike | None = None,
    fixed_seg: PathLike | None = None,
    out: PathLike = "hyperreg_view",
    lam: float | None = None,
    grid: Sequence[float] = DEFAULT_GRID,
    init: str = DEFAULT_INIT,
    normalization: str = DEFAULT_NORMALIZATION,
    resample: bool = True,
    npz_geometry: str | None = None,
    bias_correct: bool = False,
    replace_nonfinite: float | None = None,
    fixed_mask: PathLike | None = None,
    moving_mask: PathLike | None = None,
    preview: bool | None = None,
    contrast: str = "auto",
) -> ViewSession:
    """Read and prepare one pair for the explorer (:class:`ViewSession`).

    The pair goes through :func:`hyperreg.registration.pipeline.load_pair` once (the affine
    stage ``init`` included); every λ is then registered from it.

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph`.
        moving, fixed: Image files (NIfTI, MGZ, or npz with ``npz_geometry``).
        moving_seg, fixed_seg: Label map files, or None (Dice and contours need both).
        out: Folder the page's Save writes into.
        lam: Starting λ in [0, 1], or None for the model's default.
        grid: λ values of the background sweep.
        init, normalization, resample, npz_geometry, bias_correct, replace_nonfinite: As in
            :func:`hyperreg.apps.register.register_files`.
        fixed_mask, moving_mask: Cost masks (0/1 files; ANTs' ``-x``), or None: as in
            :func:`~hyperreg.registration.pipeline.load_pair` (the affine stage, refinement
            and the verdict count only voxels inside them).
        preview: As :class:`ViewSession` (None: in 3D when the model runs more than one
            forward pass per λ).
        contrast: ``"auto"`` (default), ``"same"`` or ``"different"``: as in
            :func:`~hyperreg.apps.register.register_files` (the affine stage run again, the
            moving image remapped for the network, the verdict's similarity and λ).

    Returns:
        The :class:`ViewSession` (its background sweep not started).

    Raises:
        FileNotFoundError: If an input is missing.
        ValueError: As :func:`~hyperreg.registration.pipeline.load_pair`, or ``lam`` or a
            value of ``grid`` outside [0, 1], or an unknown ``contrast`` (``InputError``).
    """
    check_option("open_view", "contrast", contrast, CONTRAST_CHOICES)  # before the affine stage
    if lam is not None:
        check_view_lam(lam)
    for value in grid:
        check_view_lam(value)
    pair = load_pair(
        moving,
        fixed,
        model=model,
        moving_seg=moving_seg,
        fixed_seg=fixed_seg,
        init=init,
        normalization=normalization,
        resample=resample,
        npz_geometry=npz_geometry,
        bias_correct=bias_correct,
        replace_nonfinite=replace_nonfinite,
        fixed_mask=fixed_mask,
        moving_mask=moving_mask,
        contrast=contrast,
    )
    similarity = contrast_similarity(pair, contrast)
    options = dict(grid=grid, lam=lam, preview=preview, similarity=similarity)
    return ViewSession(model, pair, out, **options)
