"""What one registration runs with, resolved once: :class:`RegistrationSettings`.

:func:`resolve_settings` turns a model plus the options a caller asked for (λ, refinement,
passes, device, AMP, chunk, never-worse) into one frozen record, checked before any work; the
engine (:func:`hyperreg.registration.engine.run`) runs exactly what it says, and every
:class:`~hyperreg.registration.results.PairResult` carries it. An option a path cannot honour
is an :class:`~hyperreg.InputError` naming the option. The refinement's similarity is the
model's own unless asked for (:func:`refine_similarity`, the one place a rule choosing another,
e.g. for pairs of different contrasts, plugs in). Must not import training, apps or cli.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hyperreg._errors import InputError
from hyperreg.method.model import HyperMorph
from hyperreg.registration.passes import MAX_PASSES
from hyperreg.registration.refine import Refinement, check_refinement, with_model_similarity

__all__ = ["RegistrationSettings", "refine_similarity", "resolve_settings"]


@dataclass(frozen=True)
class RegistrationSettings:
    """One registration's settings, resolved once (:func:`resolve_settings`).

    Attributes:
        lams: λ values in [0, 1], in the order results come back.
        lambda_source: Where the λ came from (one line; "given" when the caller chose them).
        refinement: Test-time refinement (steps, similarity, lr, levels), or None (none).
        passes: Network passes per λ, composed (1 to
            :data:`~hyperreg.registration.passes.MAX_PASSES`).
        flips: The network averages its flow with the left-right mirrored pair's
            (``model.config.flip_average``, eval mode).
        device: The model's device, e.g. ``"cpu"`` or ``"cuda:0"``.
        amp: bfloat16 autocast of the network's forward passes (CUDA only).
        chunk: Most λ per batched forward pass; None: all on a GPU, one on a CPU.
        inverse: Also compute each field's inverse.
        ncc: Also score the network's moved image by local NCC (``PairResult.ncc``).
        never_worse: Keep the better of the pair as it came and the affine alone when the
            registration lowered the similarity.
        judged: Give each result its verdict (False: no verdict, no never-worse rule).
        similarity: The similarity the verdict judges by (``"ncc"``, ``"mse"``, ``"mi"``,
            ``"ngf"``); None: the refinement's, or the model's own without refinement
            (``"ngf"`` for a pair of other contrasts,
            :func:`hyperreg.registration.contrast.pair_similarity`).
    """

    lams: tuple[float, ...]
    lambda_source: str = "given"
    refinement: Refinement | None = None
    passes: int = 1
    flips: bool = False
    device: str = "cpu"
    amp: bool = False
    chunk: int | None = None
    inverse: bool = False
    ncc: bool = False
    never_worse: bool = True
    judged: bool = True
    similarity: str | None = None

    @property
    def refined(self) -> bool:
        """Whether any refinement step runs."""
        return self.refinement is not None and self.refinement.steps > 0

    def as_dict(self) -> dict[str, Any]:
        """The settings as plain JSON values (for record.json and batch records)."""
        out = dataclasses.asdict(self)
        out["lams"] = [float(v) for v in self.lams]
        return out

    def text(self) -> str:
        """One line: passes, flips, refinement, device and AMP (the ``-v`` line)."""
        flips = ", flip averaging" if self.flips else ""
        refine = "none"
        if self.refined:
            r = self.refinement
            assert r is not None
            refine = f"{r.steps} steps of {r.sim}, lr {r.lr:g}, {r.levels} level(s)"
        amp = ", bf16 autocast" if self.amp else ""
        chunk = "" if self.chunk is None else f", chunk {self.chunk}"
        return (
            f"settings: passes {self.passes}{flips}; refinement {refine}; "
            f"device {self.device}{amp}{chunk}"
        )


def refine_similarity(model: HyperMorph, asked: str | None) -> str:
    """The similarity a refinement of ``model`` minimises: ``asked`` when given, else the one
    the model was trained with (``model.objective.similarity``; an MSE-trained model is refined
    with MSE, not NCC). The one place where a rule choosing another similarity plugs in."""
    sim = with_model_similarity(model, Refinement(sim=asked)).sim
    assert sim is not None
    return sim


def resolve_settings(
    model: HyperMorph,
    lams: Sequence[float],
    refinement: Refinement | None = None,
    *,
    lambda_source: str = "given",
    refine_sim: str | None = None,
    passes: int | None = None,
    inverse: bool = False,
    chunk: int | None = None,
    amp: bool = False,
    ncc: bool = False,
    never_worse: bool = True,
    judged: bool = True,
    similarity: str | None = None,
    fn: str = "resolve_settings",
) -> RegistrationSettings:
    """The :class:`RegistrationSettings` of one registration, checked before any work.

    Args:
        model: The :class:`~hyperreg.method.model.HyperMorph` that registers (its device, its
            recorded ``passes`` and ``flip_average``, its objective's similarity).
        lams: λ values in [0, 1].
        refinement: Refinement asked for, or None; 0 steps is none. Its ``sim`` becomes
            ``refine_sim`` when that is given, and the model's own when neither names one
            (:func:`refine_similarity`).
        lambda_source: Where the λ came from (recorded).
        refine_sim: The refinement's similarity, overriding ``refinement.sim``.
        passes: Network passes per λ; None: the model's own (1 with ``inverse``).
        inverse, chunk, amp, ncc, never_worse, judged, similarity: See
            :class:`RegistrationSettings`.
        fn: The public function named in errors.

    Returns:
        A frozen :class:`RegistrationSettings`.

    Raises:
        InputError: Naming the option: a λ outside [0, 1] or none (``lambda``); ``passes``
            not in 1..MAX_PASSES or more than 1 with ``inverse``; ``chunk`` not a positive
            integer; ``amp`` on a model not on CUDA, or with refinement (the refinement's
            gradients run in float32: it cannot honour ``amp``); invalid refinement settings.
    """
    values = [float(v) for v in lams]
    if not values or not all(0.0 <= v <= 1.0 for v in values):
        raise InputError(fn, "{0} must hold values in [0, 1], got {got}", "lambda", got=values)
    if passes is None:
        passes = 1 if inverse else model.config.passes
    if isinstance(passes, bool) or not isinstance(passes, int) or not 1 <= passes <= MAX_PASSES:
        message = "{0} must be an integer from 1 to {most}, got {got!r}"
        raise InputError(fn, message, "passes", most=MAX_PASSES, got=passes)
    if inverse and passes != 1:
        raise InputError(fn, "{0} needs a single network pass (passes 1)", "inverse")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise InputError(fn, "{0} must be a positive integer, got {got!r}", "chunk", got=chunk)
    device = next(model.parameters()).device
    if refinement is not None:
        sim = refine_similarity(model, refine_sim or refinement.sim)
        refinement = dataclasses.replace(refinement, sim=sim)
        check_refinement(fn, refinement)
        if refinement.steps == 0:
            refinement = None
    if amp and refinement is not None:
        message = "{0} applies to the network alone (refinement runs in float32): give {1} 0"
        raise InputError(fn, message, "amp", "refine")
    if amp and device.type != "cuda":
        message = "{0} (bfloat16 autocast) needs a model on CUDA, got device '{device}'"
        raise InputError(fn, message, "amp", device=device)
    return RegistrationSettings(
        lams=tuple(values),
        lambda_source=lambda_source,
        refinement=refinement,
        passes=passes,
        flips=bool(model.config.flip_average),
        device=str(device),
        amp=bool(amp),
        chunk=chunk,
        inverse=bool(inverse),
        ncc=bool(ncc),
        never_worse=bool(never_worse),
        judged=bool(judged),
        similarity=similarity,
    )
