"""The one inference engine: a prepared pair and its settings in, one result per λ out.

:func:`run` registers a :class:`~hyperreg.registration.prepared.PreparedPair` with a
:class:`~hyperreg.registration.settings.RegistrationSettings`: the network's passes (composed,
:mod:`hyperreg.registration.passes`), flip averaging (the model's own, eval mode), λ batched
within ``chunk`` (every pass of a multi-pass model batched over the λ of a chunk: pass 1 for all
of them, then pass 2), AMP and device; refinement per λ
(:func:`~hyperreg.registration.refine.refine_pair`, or the last pass of
:func:`~hyperreg.registration.passes.register_passes`); then each raw result is finished by the
pair (outputs through the chain, Dice, the verdict and never-worse decision of
:mod:`hyperreg.registration.verdict`). Must not import training, apps or cli.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any
import torch

from hyperreg._errors import InputError
from hyperreg.method.losses import ncc_loss
from hyperreg.geometry.io import Volume
from hyperreg.method.model import HyperMorph, RegistrationOutput
from hyperreg.method.spatial import compose_displacements, warp
from hyperreg.registration.lambdas import (
    map_lambda_chunks,
    side_by_side,
    staged_side_by_side,
    sweep_lambdas,
)
from hyperreg.registration.pairs import network_inputs, result_from_output, smoothness_of
from hyperreg.registration.passes import register_passes
from hyperreg.registration.refine import Refinement, refine_pair
from hyperreg.registration.results import PairResult, RegistrationResult
from hyperreg.registration.settings import RegistrationSettings

__all__ = ["ndim_error", "run"]


def run(prepared: Any, model: HyperMorph, settings: RegistrationSettings) -> list[PairResult]:
    """Register ``prepared`` at every λ of ``settings``; one :class:`PairResult` per λ.

    Each result carries ``settings`` (``PairResult.settings``). Without refinement and without
    an inverse, the λ run in batched forward passes of at most ``settings.chunk`` λ (all passes
    of a chunk before the next chunk); otherwise one λ at a time. On a CPU with more than one
    torch thread, one-λ chunks and the finishing of each λ (chain, Dice, verdict) after the
    first run side by side on the threads
    (:func:`~hyperreg.registration.lambdas.side_by_side`): the same values, sooner. Composed
    passes in one-λ chunks queue every λ's passes first and its finishing after them, on the
    same workers (:func:`~hyperreg.registration.lambdas.staged_side_by_side`), so the
    finishing fills a thread that an uneven last round of passes (11 λ on two threads) would
    leave idle.

    Args:
        prepared: The :class:`~hyperreg.registration.prepared.PreparedPair` (the pair after
            its affine stage; that module imports this one, hence no annotation here).
        model: A trained :class:`~hyperreg.method.model.HyperMorph` of the pair's ndim.
        settings: From :func:`~hyperreg.registration.settings.resolve_settings`.

    Returns:
        One :class:`PairResult` per λ, in the order of ``settings.lams``.

    Raises:
        InputError: A model of another dimensionality (``model``).
    """
    fn = "register"
    if model.config.ndim != prepared.fixed.ndim:
        raise ndim_error(fn, model, prepared.fixed)

    def finish(r: RegistrationResult) -> PairResult:
        result = prepared.finish(
            r,
            settings.refinement,
            model,
            settings.never_worse,
            settings.judged,
            settings.similarity,
        )
        result.settings = settings
        return result

    chunks = _one_lambda_chunks(prepared, model, settings)
    if chunks is not None:  # passes and finishing of every λ on the threads, side by side
        staged = staged_side_by_side(
            chunks, lambda raw: [finish(r) for r in raw], range(len(settings.lams)), "cpu"
        )
        assert staged is not None  # a CPU, two threads and two λ at least
        return [r for done in staged for r in done]
    raw = _raw_results(prepared, model, settings)
    # the first fills the pair's caches (similarities before and after the affine, masks)
    first = [finish(r) for r in raw[:1]]
    return first + side_by_side(finish, raw[1:], settings.device)


def _one_lambda_chunks(
    prepared: Any, model: HyperMorph, settings: RegistrationSettings
) -> Callable[[int], list[RegistrationResult]] | None:
    """The raw results of the λ at an index, one λ at a time, when the λ run in one-λ
    chunks of composed network passes on a CPU (:func:`_batched_passes`'s chunks); else None.
    :func:`run` then hands the passes and the finishing of each λ to
    :func:`~hyperreg.registration.lambdas.staged_side_by_side`."""
    device = next(model.parameters()).device
    if settings.refined or settings.inverse or settings.passes == 1 or device.type != "cpu":
        return None
    if (settings.chunk or 1) != 1 or min(torch.get_num_threads(), len(settings.lams)) < 2:
        return None  # one thread or one λ: nothing runs side by side
    return _passes_chunks(prepared, model, settings, **_network_options(prepared))


def _raw_results(
    prepared: Any, model: HyperMorph, settings: RegistrationSettings
) -> list[RegistrationResult]:
    """The model's raw results (fields on the fixed grid) of every λ of ``settings``."""
    inputs: dict[str, Any] = _network_options(prepared)
    lams = list(settings.lams)
    if settings.refined or settings.inverse:
        inputs["masks"] = prepared.cost_masks()  # the refinement similarity's cost masks
        if settings.passes != 1:
            return [
                register_passes(
                    model,
                    prepared.network_image(),
                    prepared.fixed,
                    lam,
                    settings.passes,
                    settings.refinement,
                    labels=prepared.labels,
                    normalization=prepared.normalization,
                    ncc=settings.ncc,
                    **inputs,
                )
                for lam in lams
            ]
        return [
            refine_pair(
                model,
                prepared.network_image(),
                prepared.fixed,
                lam,
                settings.refinement or Refinement(steps=0),
                normalization=prepared.normalization,
                inverse=settings.inverse,
                **inputs,
            )
            for lam in lams
        ]
    if settings.passes == 1:
        return sweep_lambdas(
            model,
            prepared.network_image(),
            prepared.fixed,
            lams,
            chunk=settings.chunk,
            amp=settings.amp,
            normalization=prepared.normalization,
            ncc=settings.ncc,
            **inputs,
        )
    return _batched_passes(prepared, model, settings, **inputs)


def _network_options(prepared: Any) -> dict[str, Any]:
    """What the network's raw results carry: with an affine in the chain, finish() samples
    the original files through affine + field, so the model's own moved image, label map and
    Dice would be discarded."""
    return dict(
        moving_seg=None if prepared.chained else prepared.aligned_seg,
        fixed_seg=None if prepared.chained else prepared.fixed_seg,
        images=not prepared.chained,
    )


def _batched_passes(
    prepared: Any,
    model: HyperMorph,
    settings: RegistrationSettings,
    *,
    moving_seg: object,
    fixed_seg: object,
    images: bool,
) -> list[RegistrationResult]:
    """Composed network passes for every λ, batched: for each chunk of λ, pass 1 for all of
    them, then pass 2 on their moved images, ...; the same composition as
    :func:`~hyperreg.registration.passes.register_passes` (every pass sees the normalised
    moving image warped once by the composed field so far). Chunks of one λ on a CPU run side
    by side on the torch threads (:func:`~hyperreg.registration.lambdas.map_lambda_chunks`)."""
    device = next(model.parameters()).device
    count = len(settings.lams)
    step = settings.chunk or (1 if device.type == "cpu" else count)
    chunk = _passes_chunks(
        prepared, model, settings, moving_seg=moving_seg, fixed_seg=fixed_seg, images=images
    )
    return map_lambda_chunks(chunk, range(0, count, step), device, step)


def _passes_chunks(
    prepared: Any,
    model: HyperMorph,
    settings: RegistrationSettings,
    *,
    moving_seg: object,
    fixed_seg: object,
    images: bool,
) -> Callable[[int], list[RegistrationResult]]:
    """The function that runs :func:`_batched_passes`'s chunk starting at a λ index (thread
    safe: :func:`~hyperreg.registration.lambdas.side_by_side`); the pair's network inputs are
    made once, here."""
    notes: list[str] = []
    device = next(model.parameters()).device
    moving, fixed = prepared.network_image(), prepared.fixed
    moving_t, fixed_t, grid = network_inputs(
        model, moving, fixed, prepared.normalization, device, notes
    )
    lam_all = torch.tensor(settings.lams, dtype=torch.float32, device=device)
    count = lam_all.numel()
    step = settings.chunk or (1 if device.type == "cpu" else count)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if settings.amp else None

    @torch.no_grad()
    def chunk(start: int) -> list[RegistrationResult]:
        lam = lam_all[start : start + step]
        shape = (lam.numel(), *moving_t.shape[1:])
        source, target = moving_t.expand(shape), fixed_t.expand(shape)
        current, total = source, None
        for index in range(settings.passes):
            with amp or contextlib.nullcontext():
                out = model(current, target, lam)
            disp = out.disp.float()
            total = disp if total is None else compose_displacements(total, disp)
            current = out.moved.float() if index == 0 else warp(source, total)
        composed = RegistrationOutput(moved=current, disp=total, velocity=None)
        smoothness = smoothness_of(model, out)
        similarity = None
        if settings.ncc:
            similarity = -ncc_loss(current, target, reduction="none")
        results = []
        for index in range(lam.numel()):
            result = result_from_output(
                composed, index, float(lam[index]), moving_seg, fixed_seg, notes,
                prepared.labels, moving=moving, grid=grid, images=images,
            )  # fmt: skip
            result.smoothness = float(smoothness[index])
            if similarity is not None:
                result.ncc = float(similarity[index])
            results.append(result)
        return results

    return chunk


def ndim_error(fn: str, model: HyperMorph, fixed: Volume) -> InputError:
    """The error for a model of another dimensionality than the pair (argument ``model``)."""
    message = "the model is {m}D but '{path}' is {f}D with shape {shape}; use a {f}D model"
    shape, m = fixed.spatial_shape, model.config.ndim
    return InputError(fn, message, "model", m=m, path=fixed.path, f=fixed.ndim, shape=shape)
