"""A pair after its affine stage, registered at any λ: :class:`PreparedPair`.

:class:`PreparedPair` holds what :func:`hyperreg.registration.pipeline.load_pair` read and
computed once for a pair (the images as read and as the network sees them, the label maps on
the fixed grid, the affine stage's transform, the baselines), and its
:meth:`PreparedPair.register` registers that pair at one or many λ (batched network passes,
:mod:`hyperreg.registration.lambdas`; composed passes, :mod:`hyperreg.registration.passes`; or
refinement, :mod:`hyperreg.registration.refine`) and finishes each raw result through the chain
(the moved image and label map sampled once from the original files,
:func:`hyperreg.registration.chain.sample_volume`; the composed field), Dice and the verdict
(:func:`hyperreg.registration.verdict.judge`, with the never-worse rule). Reading and checking
a pair and its affine stage belong to :mod:`hyperreg.registration.pipeline`, which re-exports
this class. Must not import the pipeline (it imports this module), training, apps or cli.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hyperreg.geometry.affine import AffineTransform
from hyperreg.geometry.io import Volume, compact_labels
from hyperreg.method.metrics import registration_dice
from hyperreg.method.model import HyperMorph
from hyperreg.registration.engine import ndim_error, run
from hyperreg.registration.pairs import RegistrationResult, reused_network_tensors
from hyperreg.registration.refine import Refinement, refine_objective
from hyperreg.registration.masks import mask_tensors, masks_on_fixed_grid
from hyperreg.registration.memory import release_freed_memory
from hyperreg.registration.results import AffineStage, PairResult
from hyperreg.registration.settings import resolve_settings
from hyperreg.registration.similarity import network_input, network_similarity, on_fixed_grid
from hyperreg.registration.transform_chain import TransformChain
from hyperreg.registration.verdict import MIN_GAINS, Verdict, decompose_affine, judge

__all__ = ["PreparedPair", "ndim_error"]

logger = logging.getLogger(__name__)


@dataclass
class PreparedPair:
    """A pair read once, after the affine stage, ready for :meth:`register` at any λ.

    Attributes:
        moving: The moving image as read (its own grid).
        fixed: The fixed image as the network sees it
            (:func:`~hyperreg.registration.pipeline.model_image`: outlying voxels clipped,
            bias-corrected on request); every output is on its grid.
        moving_seg: The moving label map as read, or None. Label maps are held in the
            smallest of uint8/int16/int32 that holds their ids
            (:func:`~hyperreg.geometry.io.compact_labels`).
        fixed_seg: The fixed label map on the fixed grid, or None.
        transform: Fixed world -> moving world affine (identity without an affine stage).
        chained: Outputs are sampled through ``transform`` and the field from the originals
            (also without an affine stage when the model's moving image differs from the file).
        aligned: The model's moving image (:func:`~hyperreg.registration.pipeline.model_image`)
            on the fixed grid (through ``transform`` or the headers).
        aligned_seg: The moving label map on the fixed grid when not ``chained``, else None.
        labels: Label ids scored (the inputs' union), or None without both label maps.
        dice_before: Mean Dice with no registration, or None.
        dice_affine: Mean Dice of the affine alone (the Dice as it came where the stage kept the
            identity on the fixed grid), or None without an affine stage.
        affine: The affine stage's statistics, or None.
        normalization: Intensity normalisation of the model inputs.
        notes: What was resampled onto which grid.
        moving_mask: The moving cost mask on the moving image's grid (boolean), or None.
        fixed_mask: The fixed cost mask on the fixed grid (boolean), or None.
        fov_fraction: Share of the fixed head inside the moving image's field of view after
            the affine stage (:func:`~hyperreg.registration.masks.field_of_view`), or None.
        shared_labels: The label ids both maps hold (the rest of ``labels`` is in one map
            only and scores 0), or None without both label maps.
        remapped: ``aligned`` drawn in the fixed image's intensities for a pair of other
            contrasts (:func:`hyperreg.registration.contrast.remap_pair`), and/or filled with
            the fixed image beyond a cut field of view
            (:func:`hyperreg.registration.masks.filled_view`): what the network and
            refinement then see (:meth:`network_image`); None: ``aligned`` itself.
        network_tensors: The pair's images on the network grid as the engine made them,
            kept for the verdict (:func:`~hyperreg.registration.pairs.reused_network_tensors`);
            emptied once the first result's verdict has scored them (:meth:`finish`).
    """

    moving: Volume
    fixed: Volume
    moving_seg: Volume | None
    fixed_seg: Volume | None
    transform: AffineTransform
    chained: bool
    aligned: Volume
    aligned_seg: Volume | None
    labels: list[int] | None
    dice_before: float | None
    dice_affine: float | None
    affine: AffineStage | None
    normalization: str
    notes: list[str]
    moving_mask: Volume | None = None
    fixed_mask: Volume | None = None
    shared_labels: list[int] | None = None
    fov_fraction: float | None = None
    remapped: Volume | None = None
    network_tensors: dict = field(default_factory=dict, repr=False, compare=False)
    _similarity: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # label maps are held in the smallest integer type of their ids (the same ids; a 256³
        # aseg in 16 MiB instead of 64): they stay for every registration of the pair
        for name in ("moving_seg", "fixed_seg", "aligned_seg"):
            if (seg := getattr(self, name)) is not None:
                setattr(self, name, compact_labels(seg))

    def register(
        self,
        model: HyperMorph,
        lams: Sequence[float],
        refinement: Refinement | None = None,
        *,
        inverse: bool = False,
        chunk: int | None = None,
        amp: bool = False,
        ncc: bool = False,
        passes: int | None = None,
        never_worse: bool = True,
        judged: bool = True,
        lambda_source: str = "given",
        similarity: str | None = None,
    ) -> list[PairResult]:
        """Register the pair at every λ of ``lams``; outputs through the chain.

        The options are resolved into one
        :class:`~hyperreg.registration.settings.RegistrationSettings`
        (:func:`~hyperreg.registration.settings.resolve_settings`, checked before any work) and
        the pair registered by the engine (:func:`hyperreg.registration.engine.run`). Without
        refinement (or with 0 steps) and without ``inverse`` every λ runs in batched
        forward passes (:func:`~hyperreg.registration.lambdas.sweep_lambdas`); otherwise each
        λ is refined for the pair (:func:`~hyperreg.registration.refine.refine_pair`).

        Every result carries a :class:`~hyperreg.registration.verdict.Verdict`: the model's
        similarity of the pair as it came, after the affine stage and registered (on the
        network grid, :func:`~hyperreg.registration.similarity.network_similarity`), the
        affine's scales and shears, and ``ok`` or ``check: <reason>``
        (:func:`~hyperreg.registration.verdict.judge`). With ``never_worse``, a registration
        less similar than the better of the other two beyond the margin is replaced by it
        (the identity field after the affine, or the pair as it came). A pair that needs
        checking is logged as one warning naming it (``'<moving>' -> '<fixed>' at λ <λ>:
        check: <reasons>``).

        Args:
            model: A trained :class:`~hyperreg.method.model.HyperMorph` of the pair's ndim.
            lams: λ values in [0, 1], in any order.
            refinement: Test-time refinement of each λ's field, or None.
            inverse: Also compute each field's inverse (a model with a velocity field): the
                whole chain inverted (:meth:`~hyperreg.registration.transform_chain.
                TransformChain.inverse`), on the moving grid when the pair is ``chained``.
            chunk, amp, ncc: See :func:`~hyperreg.registration.lambdas.sweep_lambdas`.
            passes: Network passes per λ, composed (:func:`~hyperreg.registration.passes.
                register_passes`; refinement refines the last); None (default): the model's
                own (``model.config.passes``, 1 unless it records more; 1 with ``inverse``).
            never_worse: Keep the better of the pair as it came and the affine alone when
                the registration lowered the similarity (default True); False keeps the
                registration and only flags it in the verdict.
            judged: Give each result its verdict (default True); False: no verdict (None)
                and no never-worse rule, the model's own fields as they are (a λ search
                scoring the model, which saves the similarity evaluations).
            lambda_source: Where the λ came from, recorded in the settings (default "given").
            similarity: The similarity the verdict judges by (``"ncc"``, ``"mi"``,
                ``"ngf"``: the model's objective with that image term); None (default): the
                refinement's, or the model's own without refinement. ``"ngf"`` for a pair of
                other contrasts (:func:`hyperreg.registration.contrast.pair_similarity`).

        Returns:
            One :class:`PairResult` per λ, in the order given.

        Raises:
            InputError: As ``resolve_settings`` (an option the path cannot honour, e.g.
                ``amp`` with refinement), or a model of another dimensionality.
            ValueError: As ``refine_pair`` (``inverse`` without a velocity).
        """
        settings = resolve_settings(
            model,
            lams,
            refinement,
            passes=passes,
            inverse=inverse,
            chunk=chunk,
            amp=amp,
            ncc=ncc,
            never_worse=never_worse,
            judged=judged,
            lambda_source=lambda_source,
            similarity=similarity,
            fn="PreparedPair.register",
        )
        # the engine's network-grid tensors, kept for the verdict (pairs.network_tensor)
        with reused_network_tensors(self.network_tensors):
            return run(self, model, settings)

    def network_image(self) -> Volume:
        """The moving image the network and refinement see on the fixed grid: ``remapped``
        when set, else ``aligned``."""
        return self.aligned if self.remapped is None else self.remapped

    def cost_masks(self) -> tuple[Volume | None, Volume | None] | None:
        """The cost masks on the fixed grid for refinement (computed once), or None."""
        if "masks" not in self._similarity:
            self._similarity["masks"] = masks_on_fixed_grid(
                self.fixed, self.fixed_mask, self.moving_mask, self.transform, self.chained
            )
        return self._similarity["masks"]

    def _chain(
        self,
        transform: AffineTransform,
        disp: np.ndarray | None,
        raw: RegistrationResult,
        moved: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """``(moved, moved_seg, warp)`` through ``transform`` and ``disp`` (None: identity);
        ``moved``, when given, is the moved image already sampled through them
        (:meth:`_moved`), not sampled again."""
        if not self.chained and disp is None:  # the pair as it came, on the fixed grid
            seg = None if self.aligned_seg is None else self.aligned_seg.data.astype(np.int32)
            return self.aligned.data, seg, np.zeros_like(raw.disp)
        if not self.chained:
            return raw.moved, raw.moved_seg, raw.disp
        chain = TransformChain(transform, disp, self.fixed, self.moving)
        if moved is None:
            moved = chain.apply(self.moving).data
        moved_seg = None
        if self.moving_seg is not None:
            moved_seg = chain.apply(self.moving_seg, label=True).data
        return moved, moved_seg, chain.displacement()

    def _moved(self, raw: RegistrationResult) -> np.ndarray:
        """The registered moved image alone (what the verdict judges), through the affine
        stage and ``raw.disp`` when ``chained``, else the model's own."""
        if not self.chained:
            return raw.moved
        chain = TransformChain(self.transform, raw.disp, self.fixed, self.moving)
        return chain.apply(self.moving).data

    def chain(self, result: PairResult | None = None) -> TransformChain:
        """The transform of ``result`` as one :class:`~hyperreg.registration.transform_chain.
        TransformChain` (fixed grid -> moving file): the affine stage then ``result.disp``
        None: the affine alone. The identity when the verdict kept the pair as it came."""
        if result is None:
            return TransformChain(self.transform, None, self.fixed, self.moving)
        kept = "registered" if result.verdict is None else result.verdict.kept
        transform = AffineTransform.identity() if kept == "headers" else self.transform
        disp = result.disp if kept == "registered" else None
        return TransformChain(transform, disp, self.fixed, self.moving)

    def _inverse(self, kept: str, raw: RegistrationResult) -> np.ndarray | None:
        """The inverse field of the kept transform: on the moving grid through the whole chain
        when ``chained`` (:meth:`TransformChain.inverse`), else ``raw.inverse_disp`` (fixed
        grid; zero when the field was not kept); None when not asked for."""
        if raw.inverse_disp is None:
            return None
        if not self.chained:
            registered = kept == "registered"
            return raw.inverse_disp if registered else np.zeros_like(raw.inverse_disp)
        transform = AffineTransform.identity() if kept == "headers" else self.transform
        field, inverse = (raw.disp, raw.inverse_disp) if kept == "registered" else (None, None)
        chain = TransformChain(transform, field, self.fixed, self.moving, inverse)
        return chain.inverse().displacement()

    def finish(
        self,
        raw: RegistrationResult,
        refinement: Refinement | None,
        model: HyperMorph,
        never_worse: bool,
        judged: bool = True,
        similarity: str | None = None,
    ) -> PairResult:
        """The chain's outputs, typed statistics and verdict of one raw model result (the
        engine's last step, :func:`hyperreg.registration.engine.run`)."""
        # one full-size output at a time: the moved image, its verdict, then (a registration
        # kept) the label map and the composed field, each after the last one's temporaries
        # went back to the system (peak memory at 256³: the verdict never sees the field)
        release_freed_memory()  # what the network and refinement freed
        moved = self._moved(raw)
        verdict = None
        if judged:
            verdict = self._verdict(model, refinement, moved, raw, never_worse, similarity)
        # the engine is done and the verdict has scored the kept network-grid tensors (the
        # fixed one stays in its cache): handed back before the full-size outputs
        self.network_tensors.clear()
        if judged:
            release_freed_memory()
        kept = "registered" if verdict is None else verdict.kept
        disp = raw.disp
        if kept == "registered":
            moved, moved_seg, warp = self._chain(self.transform, raw.disp, raw, moved)
        else:  # the better of the pair as it came and the affine alone
            del moved
            transform = self.transform if kept == "affine" else AffineTransform.identity()
            moved, moved_seg, warp = self._chain(transform, None, raw)
            disp = np.zeros_like(raw.disp)
        if verdict is not None and not verdict.ok:  # one line naming the pair (the CLI's only)
            names = [_shown(v.path) for v in (self.moving, self.fixed)]
            logger.warning("'%s' -> '%s' at λ %g: %s", *names, raw.lam, verdict.text)
        dice = None
        if moved_seg is not None and self.fixed_seg is not None:
            dice = registration_dice(moved_seg, self.fixed_seg.data, labels=self.labels)
        stats = raw.refinement if raw.refinement is not None and raw.refinement.steps else None
        result = PairResult(
            lam=raw.lam,
            moved=moved,
            moved_seg=moved_seg,
            disp=disp,
            warp=warp,
            dice=dice,
            dice_before=self.dice_before if dice is not None else None,
            dice_affine=self.dice_affine if dice is not None else None,
            shared_labels=self.shared_labels if dice is not None else None,
            folding_fraction=raw.folding_fraction,
            log_jacobian_std=raw.log_jacobian_std,
            smoothness=raw.smoothness,
            ncc=raw.ncc,
            affine=self.affine,
            refinement=stats,
            inverse_disp=self._inverse(kept, raw),
            resampled=[*self.notes, *(n for n in raw.resampled if n not in self.notes)],
            verdict=verdict,
        )
        if kept != "registered":  # no field: its statistics are the identity's
            result.folding_fraction = result.log_jacobian_std = 0.0
            result.smoothness = 0.0 if result.smoothness is not None else None
        return result

    def _verdict(
        self,
        model: HyperMorph,
        refinement: Refinement | None,
        moved: np.ndarray,
        raw: RegistrationResult,
        never_worse: bool,
        similarity: str | None = None,
    ) -> Verdict:
        """The verdict on one registration (:func:`~hyperreg.registration.verdict.judge`), by
        ``similarity`` when given (else the refinement's or the model's; the gain it must
        show, :data:`~hyperreg.registration.verdict.MIN_GAINS`); the similarities before and
        after the affine are scored once per pair and similarity, on the moving image as
        read (never the ``remapped`` one the network saw)."""
        refined = refinement is not None and refinement.steps > 0
        objective = refine_objective(model, refinement) if refined else model.objective
        if similarity is not None and similarity != objective.similarity:
            objective = refine_objective(model, Refinement(sim=similarity))
        cache, norm = self._similarity, self.normalization
        if "fixed" not in cache:
            cache["fixed"] = network_input(model, self.fixed, self.fixed, norm)
            # every candidate scored inside the fixed mask and the affine-aligned moving mask
            masks = mask_tensors(model, self.fixed, self.cost_masks(), _device(model))
            cache["weight"] = None if masks is None else _product(*masks)
        fixed_t, weight = cache["fixed"], cache["weight"]
        if objective.similarity not in cache:  # the pair as it came, and after the affine
            # as it came: the moving file straight onto the network grid through the headers
            # (NaN, not a candidate, for a 2D slice in another plane: it needs the affine)
            before_score = math.nan
            with contextlib.suppress(ValueError):
                before = self.moving if self.chained else self.aligned
                before_t = network_input(model, before, self.fixed, norm)
                before_score = network_similarity(objective, before_t, fixed_t, weight)
            affine = network_input(model, self.aligned, self.fixed, norm) if self.chained else None
            cache[objective.similarity] = (
                before_score,
                None if affine is None else network_similarity(objective, affine, fixed_t, weight),
            )
        before_score, affine_score = cache[objective.similarity]
        registered = on_fixed_grid(moved, self.fixed, self.moving)
        registered_t = network_input(model, registered, self.fixed, norm)
        after = network_similarity(objective, registered_t, fixed_t, weight)
        shape = None if self.affine is None else decompose_affine(self.transform.matrix)
        return judge(
            before_score,
            affine_score,
            after,
            folding_fraction=raw.folding_fraction,
            affine=shape,
            never_worse=never_worse,
            field_of_view=self.fov_fraction,
            min_gain=MIN_GAINS.get(objective.similarity, 0.0),
        )


def _shown(path: Any) -> str:
    """``path`` as a warning names it: relative to the working folder when inside it, else
    its folder and file name (``sub-01/T1w.nii.gz``); ``<in-memory>`` without one."""
    if not path:
        return "<in-memory>"
    path = Path(path).absolute()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(Path(path.parent.name, path.name))


def _device(model: HyperMorph) -> Any:
    """The device of ``model``'s parameters."""
    return next(model.parameters()).device


def _product(fixed: Any, moving: Any) -> Any:
    """The product of two optional weight tensors (None for none)."""
    if fixed is None or moving is None:
        return moving if fixed is None else fixed
    return fixed * moving
