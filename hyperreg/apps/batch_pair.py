"""One pair of a batch: registered in its folder, then recorded as finished or failed.

:class:`PairRun` holds one :func:`hyperreg.apps.batch.batch_register` call's resolved settings:
what a pair's finished record must match (:meth:`PairRun.identity`) and how one pair is run
(:meth:`PairRun.run`): skipped when finished, else registered by the function it is given,
with its warnings collected (:func:`pair_warnings`), and recorded on disk (``record.json`` with
the pair's summary cells, or ``failure.json`` with its error). An output folder without room
stops the batch (:func:`stopped`). Must not import :mod:`hyperreg.apps.batch`, train or cli,
nor torch.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperreg._errors import failure_text
from hyperreg._files import write_json
from hyperreg.apps.batch_records import (
    FAILURE,
    RECORD,
    finished,
    pair_identity,
    read_record,
    scores,
)
from hyperreg.registration.contrast import OTHER_SIMILARITY
from hyperreg.registration.refine import Refinement, with_model_similarity

if TYPE_CHECKING:  # annotations only
    from hyperreg.apps.inputs import PairSpec

__all__ = ["NO_ROOM", "PairRun", "output_names", "pair_warnings", "record_cells", "stopped"]

logger = logging.getLogger(__name__)

# errors of the output folder, not of one pair: the batch stops (every pair would fail alike)
NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


@dataclass
class PairRun:
    """The settings every pair of one batch is registered with, resolved.

    Attributes:
        model: The model (its ``config`` gives the passes and flip averaging when not given).
        lam: λ for rows without their own: a number, ``"auto"`` or None (the model's default).
        default_lam: The model's default λ (what a record holds for ``lam`` None).
        rank: This process's rank, stored in each record.
        root: The folder of the pair folders (``<out>/pairs``).
        register: Registers one pair with its outputs in its folder:
            ``register(model, pair, lam, folder, outputs, **options)`` -> a
            :class:`~hyperreg.registration.pipeline.PairResult`.
        options: The keywords of :func:`~hyperreg.apps.register.register_files` for every pair
            (``refine``, ``init``, ``passes``, ``bias_correct`` and ``never_worse`` among them).
    """

    model: Any
    lam: float | str | None
    default_lam: float | str
    rank: int
    root: Path
    register: Callable[..., Any]
    options: dict[str, Any]

    def identity(self, pair: PairSpec) -> dict[str, Any]:
        """What a finished record of ``pair`` must match
        (:func:`~hyperreg.apps.batch_records.pair_identity`, plus ``bias_correct`` when on,
        ``keep_worse`` when ``never_worse`` is off and ``contrast`` when the row's, else the
        batch's, is not ``"auto"``)."""
        options, config = self.options, self.model.config
        planned = pair.lam if pair.lam is not None else self.lam  # None: the model's default
        refine = options["refine"]
        if isinstance(refine, Refinement):  # the similarity it runs with (None: the model's)
            refine = with_model_similarity(self.model, refine)
        identity = pair_identity(
            pair,
            self.default_lam if planned is None else planned,
            refine,
            options["init"],
            options["passes"] or config.passes,
            config.flip_average,
        )
        if options["bias_correct"]:  # a record made without it is not this registration
            identity["bias_correct"] = True
        if not options["never_worse"]:
            identity["keep_worse"] = True
        contrast = pair.contrast or options.get("contrast", "auto")
        if contrast != "auto":  # a record made with auto is not this registration
            identity["contrast"] = contrast
        return identity

    def run(self, pair: PairSpec) -> str:
        """Run one pair: ``"skipped"`` if its record matches and its outputs exist;
        ``"failed"`` if it raised (its ``failure.json`` written, the error logged); else
        ``"done"`` (its ``record.json`` written, any ``failure.json`` removed, an earlier
        ``affine.mat`` too without an affine stage).

        Raises:
            OSError: From :func:`stopped`, if the output folder has no room left.
        """
        folder = self.root / pair.name
        identity = self.identity(pair)
        outputs = output_names(pair, self.options["init"])
        if finished(folder, read_record(folder), identity):
            return "skipped"
        folder.mkdir(exist_ok=True)
        tic = time.perf_counter()
        said: list[str] = []
        pair_lam = pair.lam if pair.lam is not None else self.lam  # None: the model's default
        try:
            with pair_warnings(pair.name, said):
                result = self.register(self.model, pair, pair_lam, folder, outputs, **self.options)
        except Exception as err:  # one bad pair must not stop the batch
            if isinstance(err, OSError) and err.errno in NO_ROOM:  # the folder's: stop
                raise stopped(err) from err
            _record_failure(pair, folder, identity, err)
            return "failed"
        seconds = time.perf_counter() - tic
        record = {**identity, **record_cells(pair, self.lam, result, said), "seconds": seconds}
        record.update(rank=self.rank, **outputs)
        write_json(folder / RECORD, record)
        (folder / FAILURE).unlink(missing_ok=True)
        if self.options["init"] == "none":  # an earlier run's affine stage is not this result
            (folder / "affine.mat").unlink(missing_ok=True)
        return "done"


def _record_failure(pair: PairSpec, folder: Path, identity: dict, err: Exception) -> None:
    """Log and store (``failure.json``) one pair's error."""
    # the error rides along: a front end may name its arguments its own way (options)
    logger.warning("%s failed: %s", pair.name, failure_text(err))
    failure = {**identity, "error": failure_text(err), "traceback": traceback.format_exc()}
    write_json(folder / FAILURE, failure)


def stopped(err: OSError) -> OSError:
    """An output folder without room: the error (naming the file), and how to go on."""
    text = err.strerror or str(err)
    return OSError(
        err.errno, f"{text}; the pairs finished so far are kept: make room and rerun to resume"
    )


def record_cells(pair: PairSpec, lam: float | str | None, result: Any, said: list[str]) -> dict:
    """A finished pair's record cells (beside its identity, time, rank and outputs): the λ used
    and why, the contrast it ran as (``contrast_used``: ``"different"`` when the moving image
    was drawn in the fixed image's intensities and judged by normalised gradient fields,
    :mod:`hyperreg.registration.contrast`, else ``"same"``), its scores, what was resampled,
    its warnings, its Dice per label and the settings it ran with
    (:class:`~hyperreg.registration.settings.RegistrationSettings`)."""
    settings = result.settings
    other = settings is not None and settings.similarity == OTHER_SIMILARITY
    return {
        "lambda_chosen": result.lam,
        "lambda_reason": _lambda_reason(pair, lam, result),
        "contrast_used": "different" if other else "same",
        **scores(result),
        "resampled": "; ".join(result.resampled),
        "warnings": "; ".join(said),
        "dice": {str(k): v for k, v in (result.dice or {}).items()},
        "settings": None if settings is None else settings.as_dict(),
    }


@contextlib.contextmanager
def pair_warnings(name: str, said: list[str]) -> Iterator[None]:
    """Collect the warnings raised while one pair runs: each is logged once with the pair's
    name (a batch's messages must say which pair they are about) and appended to ``said``."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for text in dict.fromkeys(str(w.message) for w in seen):
                said.append(text)
                logger.warning("%s: %s", name, text)


def _lambda_reason(pair: PairSpec, lam: float | str | None, result: Any) -> str:
    """Why a pair got its λ: its row's, the one given for all, or the result's ``lam_reason``."""
    if pair.lam is not None:
        return "the row's lambda"
    return result.lam_reason if lam is None or lam == "auto" else "given for every row"


def output_names(pair: PairSpec, init: str) -> dict[str, str]:
    """A pair's output file names in its folder."""
    outputs = {
        "moved": "moved.nii.gz",
        "warp": "warp.nii.gz",
        "moved_seg": "moved_seg.nii.gz" if pair.moving_seg else "",
    }
    if init != "none":
        outputs["affine"] = "affine.mat"
    return outputs
