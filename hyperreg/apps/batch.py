"""Batch registration of many pairs: pair lists, sharding, resumable runs, failure records.

:func:`read_pairs` reads a pair CSV (:data:`~hyperreg.apps.inputs.PAIR_COLUMNS`; relative paths
are relative to the CSV). :func:`batch_register` runs :func:`hyperreg.apps.register.register_files`
on each pair of one shard and keeps a per-pair record on disk, so a rerun skips finished pairs and
a bad pair is recorded while the rest go on (:mod:`hyperreg.apps.batch_checks`, the checks before
any work; :mod:`hyperreg.apps.batch_pair`, one pair run and recorded). :func:`merge_records`
(:mod:`hyperreg.apps.batch_records`, the records on disk) turns the records into ``summary.csv``
and ``failures.csv``, after every pair, so an interrupted run has them. :func:`run_batch` is the
whole job, one process of possibly several (``torchrun``: rank ``r`` of ``N`` takes rows
``r::N``). Must not import train or cli.

Output layout under ``out`` (``<name>``: the pair's name, from its files or the CSV's ``name``
column, :func:`hyperreg.apps.inputs.read_pairs`)::

    pairs/<name>/moved.nii.gz, warp.nii.gz, moved_seg.nii.gz   (each written atomically)
    pairs/<name>/record.json     written last, atomically: the pair's summary row (= done)
    pairs/<name>/failure.json    the error of the last failed attempt (removed on success)
    summary.csv, failures.csv    merged from the records, sorted by row index
    report.html, pairs/<name>/report.html   with ``html_report``: the web report
                                 (:mod:`hyperreg.apps.batch_report`), rewritten with the summary

A rerun skips finished pairs; one whose settings differ from a finished pair's record (λ,
refinement, affine stage, passes, flip averaging, contrast) is refused before any work unless
``overwrite`` is set, which registers those pairs again, saying which.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperreg.apps.batch_checks import check_batch, check_rerun, rank_device, warn_missing
from hyperreg.apps.batch_pair import PairRun
from hyperreg.apps.batch_records import finished, merge_records, read_record
from hyperreg.apps.inputs import PairSpec, check_pair_masks, read_pairs, shard
from hyperreg.geometry.intensity import DEFAULT_NORMALIZATION

if TYPE_CHECKING:  # annotations only: the module stays light to import (no torch)
    from hyperreg.registration.pairs import PathLike

__all__ = [
    "BatchInterrupted",
    "BatchReport",
    "PairSpec",
    "batch_register",
    "merge_records",
    "read_pairs",
    "run_batch",
    "shard",
]


class BatchInterrupted(KeyboardInterrupt):
    """A batch stopped by Ctrl-C (``KeyboardInterrupt``) between or during pairs, after
    ``summary.csv`` and ``failures.csv`` were merged from the finished pairs.

    ``str(err)``: ``"interrupted after N of M pairs: rerun the same command to resume"``, N
    the pairs finished plus those failed (as the progress bar counts them), the failed ones
    said: ``"after 3 of 4 pairs (1 failed, in failures.csv)"``.

    Attributes:
        finished: Pairs of the job finished with its settings (any rank, any earlier run).
        total: Pairs in the job.
        summary: The merged ``summary.csv``, or None if merging failed too.
        failed: Pairs of the job recorded as failed (in ``failures.csv``).
    """

    def __init__(self, finished: int, total: int, summary: Path | None, failed: int = 0) -> None:
        self.finished, self.total, self.summary, self.failed = finished, total, summary, failed
        said = f" ({failed} failed, in failures.csv)" if failed else ""
        super().__init__(
            f"interrupted after {finished + failed} of {total} pairs{said}: rerun the same "
            "command to resume"
        )


@dataclass
class BatchReport:
    """What one :func:`batch_register` call did with its shard.

    Attributes:
        done: Pairs registered now.
        skipped: Pairs already finished by an earlier run (not redone).
        failed: Pairs that raised; each has a ``failure.json`` with its error.
        seconds: Wall time of the call.
    """

    done: int = 0
    skipped: int = 0
    failed: int = 0
    seconds: float = 0.0


def batch_register(
    model: Any,
    pairs: Sequence[PairSpec],
    out: PathLike,
    *,
    lam: float | str | None = None,
    normalization: str = DEFAULT_NORMALIZATION,
    resample: bool = True,
    warp_format: str = "voxel",
    progress: bool = False,
    desc: str = "pairs",
    rank: int = 0,
    refine: Any = None,
    init: str | None = None,
    npz_geometry: str | None = None,
    passes: int | None = None,
    bias_correct: bool = False,
    never_worse: bool = True,
    overwrite: bool = False,
    job: Sequence[PairSpec] | None = None,
    replace_nonfinite: float | None = None,
    html_report: bool = False,
    contrast: str = "auto",
) -> BatchReport:
    """Register every pair of ``pairs`` (one shard) with per-pair records, resumably.

    Before any work: if a pair of ``job`` has a finished record with other settings (files, λ,
    refinement, affine stage, passes, flip averaging:
    :func:`hyperreg.apps.batch_records.pair_identity`), raise unless ``overwrite``; with it,
    log which pairs are registered again and why. Then for each pair: if
    ``pairs/<name>/record.json`` matches the pair and its outputs exist, skip it. Otherwise
    check its label maps (:func:`hyperreg.apps.inputs.check_label_map`: integer ids, not an
    intensity image) and call :func:`hyperreg.apps.register.register_files`, which writes
    ``moved.nii.gz``, ``warp.nii.gz`` (and ``moved_seg.nii.gz`` with a moving label map)
    atomically, then write the record (the pair's summary row) atomically and merge
    ``summary.csv`` and ``failures.csv`` (:func:`merge_records` over ``job``). Any exception
    of one pair is stored in ``pairs/<name>/failure.json`` (type, message, traceback) and the
    loop goes on, except an output folder without room (no space, over quota, read-only: every
    pair would fail) and ``KeyboardInterrupt``, which stop it.

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph`, on the device to use.
        pairs: The pairs to run (see :func:`read_pairs`, :func:`shard`).
        out: Output folder.
        lam: λ for rows without their own: a number in [0, 1]; ``"auto"``, chosen per pair
            without labels; None (default), the model's default λ
            (:func:`hyperreg.apps.models.model_default_lambda`). The record holds the λ used
            (``lambda_chosen``) and why (``lambda_reason``).
        normalization: Intensity normalisation.
        resample: Resample inputs on other grids onto the fixed grid.
        warp_format: ``"voxel"`` or ``"itk"`` for ``warp.nii.gz``.
        progress: Show a tqdm progress bar (stderr).
        desc: Progress bar label.
        rank: Rank of this process, stored in each record (``rank`` column of the summary).
        refine: A :class:`~hyperreg.registration.refine.Refinement` to refine each pair's field
            (its settings are part of a pair's identity: a rerun with others redoes the pair);
            None: the model's default (:func:`hyperreg.apps.models.pair_refinement`).
        init: ``"affine"``, ``"rigid"`` or ``"none"``; None (default) is the pipeline's default
            (:data:`hyperreg.registration.pipeline.DEFAULT_INIT`, ``"affine"``): the affine
            stage of :func:`~hyperreg.apps.register.register_files`, once per pair; its
            transform is written as ``affine.mat`` and ``warp.nii.gz`` holds the composed
            transform. Part of a pair's identity.
        npz_geometry: Geometry of npz inputs (:func:`~hyperreg.registration.inputs.load_input`).
        passes: Network passes per pair (:func:`~hyperreg.apps.register.register_files`); None
            (default): the model's own. Part of a pair's identity when more than 1.
        bias_correct: Remove each image's bias field (N4) before the affine stage and the
            network (:func:`hyperreg.registration.pipeline.model_image`); outputs are still
            sampled from the files as read.
        never_worse: See :func:`~hyperreg.apps.register.register_files` (default True; the
            record's ``verdict`` and ``kept`` say what each pair holds). Part of a pair's
            identity when False.
        overwrite: Register again the pairs whose finished records have other settings
            (their outputs and records are replaced); False (default): refuse.
        job: Every pair of the job, all ranks' (``summary.csv`` lists these; the settings of
            all of them are checked before any work, so every rank refuses alike); None:
            ``pairs``.
        replace_nonfinite: The value NaN/inf voxels of the images take (logged with their
            count); None (default): such a pair fails. Not part of a pair's identity (a pair
            that finished had no such voxel).
        html_report: Also write the web report, ``report.html`` and a page per pair
            (:func:`hyperreg.apps.batch_report.write_report`), whenever the summary is merged,
            so an interrupted run's report lists the finished pairs.
        contrast: For rows without a ``contrast`` cell: ``"auto"`` (default), ``"same"`` or
            ``"different"`` (:func:`~hyperreg.apps.register.register_files`); records hold
            the one asked (``contrast``, part of a pair's identity) and the one run
            (``contrast_used``).

    Returns:
        A :class:`BatchReport`.

    Raises:
        ValueError: If ``lam`` is not a number in [0, 1], ``"auto"`` or None; or (an
            :class:`~hyperreg._errors.InputError` of argument ``"out"``) if pairs have
            finished records with other settings and ``overwrite`` is False (both checked
            before any work).
        OSError: If an output cannot be written for want of room (no space left, over quota,
            read-only file system); the message names the file. The pairs finished are kept.
        BatchInterrupted: On ``KeyboardInterrupt``, after merging the finished pairs.
    """
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from hyperreg.apps.models import model_default_lambda
    from hyperreg.registration.pipeline import DEFAULT_INIT

    fn = "batch_register"
    options = dict(
        normalization=normalization,
        resample=resample,
        warp_format=warp_format,
        refine=check_batch(fn, lam, model, refine, contrast),
        init=DEFAULT_INIT if init is None else init,
        npz_geometry=npz_geometry,
        passes=passes,
        bias_correct=bias_correct,
        never_worse=never_worse,
        replace_nonfinite=replace_nonfinite,
        contrast=contrast,
    )
    default = model_default_lambda(model).lam
    run = PairRun(model, lam, default, rank, Path(out) / "pairs", _register_pair, options)
    start = time.perf_counter()
    report = BatchReport()
    job = list(pairs) if job is None else list(job)
    check_rerun(fn, run.root, job, run.identity, overwrite)
    merge = _Merge(out, job, html_report)
    run.root.mkdir(parents=True, exist_ok=True)
    warn_missing(pairs)
    bar = tqdm(pairs, desc=desc, unit="pair", disable=not progress, dynamic_ncols=True)
    # with the bar, log lines (a failed pair, a verdict) go above it (tqdm.write), not onto it
    redirect = logging_redirect_tqdm() if progress else contextlib.nullcontext()
    try:
        with redirect:
            for pair in bar:
                outcome = run.run(pair)  # "done", "skipped" or "failed"
                setattr(report, outcome, getattr(report, outcome) + 1)
                if outcome != "skipped":
                    merge.soon()  # an interrupted run has its summary.csv
    except KeyboardInterrupt:
        raise _interrupted(out, run.root, job, run.identity, html_report) from None
    finally:
        bar.close()
    if merge.pending:  # the last pairs, when merging was put off
        merge.now()
    report.seconds = time.perf_counter() - start
    return report


class _Merge:
    """``summary.csv`` and ``failures.csv`` merged as pairs finish: after each pair, unless the
    last merge took over a tenth of the time since (thousands of records, fast pairs): then at
    the next pair that leaves the time, so merging costs at most about 10 % of the run."""

    def __init__(self, out: PathLike, job: Sequence[PairSpec], report: bool = False) -> None:
        self.out, self.job, self.report = out, job, report
        self.last, self.took, self.pending = 0.0, 0.0, False

    def soon(self) -> None:
        self.pending = True
        if time.perf_counter() - self.last >= 10.0 * self.took:
            self.now()

    def now(self) -> None:
        tic = time.perf_counter()
        merge_records(self.out, self.job)
        if self.report:
            from hyperreg.apps.batch_report import write_report

            write_report(self.out)
        self.last, self.took, self.pending = time.perf_counter(), time.perf_counter() - tic, False


def _interrupted(
    out: PathLike, root: Path, job: Sequence[PairSpec], identity_of: Any, report: bool = False
) -> BatchInterrupted:
    """Ctrl-C: merge what finished (and write the report, with ``report``) and count the pairs
    finished with these settings."""
    summary, failed = None, 0
    with contextlib.suppress(OSError):
        summary, _, _, failed = merge_records(out, job)
        if report:
            from hyperreg.apps.batch_report import write_report

            write_report(out)
    done = 0
    for pair in job:
        folder = root / pair.name
        done += finished(folder, read_record(folder), identity_of(pair))
    return BatchInterrupted(done, len(job), summary, failed)


def _register_pair(
    model: Any,
    pair: PairSpec,
    lam: float | str | None,
    folder: Path,
    outputs: dict[str, str],
    **options: Any,
) -> Any:
    """Check a pair's label maps and register it with its outputs in ``folder`` (its row's
    contrast, else the batch's): the :class:`~hyperreg.registration.pipeline.PairResult` of
    :func:`~hyperreg.apps.register.register_files`."""
    from hyperreg.apps.register import register_files
    from hyperreg.apps.inputs import check_label_map

    for column in ("moving_seg", "fixed_seg"):
        if getattr(pair, column) is not None:
            check_label_map("batch_register", column, getattr(pair, column))
    return register_files(
        model,
        pair.moving,
        pair.fixed,
        lam,
        moved=folder / outputs["moved"],
        warp_out=folder / outputs["warp"],
        moving_seg=pair.moving_seg,
        fixed_seg=pair.fixed_seg,
        moved_seg=folder / outputs["moved_seg"] if outputs["moved_seg"] else None,
        affine_out=folder / outputs["affine"] if "affine" in outputs else None,
        initial_affine=pair.initial_affine,
        fixed_mask=pair.fixed_mask,
        moving_mask=pair.moving_mask,
        **{**options, "contrast": pair.contrast or options["contrast"]},
    )


@dataclass
class BatchRun:
    """Output of :func:`run_batch` for one process.

    Attributes:
        report: This rank's :class:`BatchReport`.
        rank: This process's rank.
        world_size: Number of processes.
        total: Rows in the pair CSV.
        merged: ``(summary, failures, rows, failures)`` from :func:`merge_records` if this
            process merged, else None.
        model: The checkpoint file used.
        bundled: The bundled model's name when no model was named, else None.
    """

    report: BatchReport
    rank: int
    world_size: int
    total: int
    merged: tuple[Path, Path, int, int] | None
    model: Path | None = None
    bundled: str | None = None


def run_batch(
    model: PathLike | None,
    pairs_csv: PathLike,
    out: PathLike,
    *,
    lam: float | str | None = None,
    device: str = "auto",
    normalization: str = DEFAULT_NORMALIZATION,
    resample: bool = True,
    warp_format: str = "voxel",
    progress: bool = False,
    refine: Any = None,
    init: str | None = None,
    npz_geometry: str | None = None,
    passes: int | None = None,
    flip_average: bool | None = None,
    bias_correct: bool = False,
    never_worse: bool = True,
    overwrite: bool = False,
    replace_nonfinite: float | None = None,
    html_report: bool = False,
    contrast: str = "auto",
) -> BatchRun:
    """One process of a batch job: read the pairs, run this rank's shard, merge.

    Rank and world size come from ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``
    (:func:`hyperreg.training.distributed.read_env`);
    without them this is the only process. Rank ``r`` of ``N`` runs rows ``r::N``. Under
    ``torchrun`` (``MASTER_ADDR`` set, ``N > 1``) the ranks meet at a gloo barrier (a barrier
    only, so gloo serves GPU ranks too), then rank 0 merges the records, then a second barrier
    lets every rank exit together. Without a process group every rank merges when it ends
    (idempotent; the last rank to end sees every record; a rerun also re-merges). With
    ``device`` ``"auto"`` or ``"cuda"`` and CUDA present, rank ``r`` uses GPU ``LOCAL_RANK``.

    Args:
        model: Checkpoint written by ``hyperreg train``, its run folder or a bundled model's
            name; None: the bundled model for the first pair's dimensionality
            (:func:`hyperreg.apps.models.resolve_model`).
        pairs_csv: Pair CSV (:func:`read_pairs`).
        out: Output folder.
        lam: λ for rows without one (see :func:`batch_register`: a number, ``"auto"`` or
            None for the model's default).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        normalization: Intensity normalisation.
        resample: Resample inputs on other grids onto the fixed grid.
        warp_format: ``"voxel"`` or ``"itk"``.
        progress: Progress bar on rank 0.
        refine: Test-time refinement per pair (see :func:`batch_register`), or None.
        init: The affine stage per pair (see :func:`batch_register`).
        npz_geometry: Geometry of npz inputs (see :func:`batch_register`).
        passes: Network passes per pair (see :func:`batch_register`).
        flip_average: The model's test-time flip averaging on or off; None: as its file
            records (:func:`hyperreg.apps.models.resolve_model`).
        bias_correct: Remove each image's bias field (N4) before the affine stage and the
            network (:func:`hyperreg.registration.pipeline.model_image`); outputs are still
            sampled from the files as read.
        never_worse: See :func:`batch_register`.
        overwrite: Register again the pairs finished with other settings (see
            :func:`batch_register`); every rank checks every pair before any work.
        replace_nonfinite: The value NaN/inf voxels of the images take (see
            :func:`batch_register`).
        html_report: Write the web report as pairs finish and once merged (see
            :func:`batch_register`).
        contrast: For rows without a ``contrast`` cell (see :func:`batch_register`).

    Returns:
        A :class:`BatchRun`.

    Raises:
        FileNotFoundError: If the checkpoint or the CSV is missing.
        ValueError: On a bad CSV (its masks too), environment, device or λ, or pairs finished
            with other settings without ``overwrite`` (before any work).
        OSError: If an output folder has no room left (see :func:`batch_register`).
        BatchInterrupted: On Ctrl-C, after merging the finished pairs.
    """
    import torch

    from hyperreg.apps.models import check_lambda, resolve_model
    from hyperreg.training.distributed import read_env

    rank, world, local_rank = read_env()
    pairs = read_pairs(pairs_csv)
    check_pair_masks("run_batch", pairs_csv, pairs)
    check_lambda("run_batch", lam)
    mine = shard(pairs, rank, world)
    resolved = rank_device(device, world, local_rank)
    resolved_model = resolve_model(model, resolved, image=pairs[0].fixed, flip_average=flip_average)
    group = world > 1 and "MASTER_ADDR" in os.environ and torch.distributed.is_available()
    if group and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        report = batch_register(
            resolved_model.model,
            mine,
            out,
            lam=lam,
            normalization=normalization,
            resample=resample,
            warp_format=warp_format,
            progress=progress and rank == 0,
            desc=f"rank {rank}/{world}" if world > 1 else "pairs",
            rank=rank,
            refine=refine,
            init=init,
            npz_geometry=npz_geometry,
            passes=passes,
            bias_correct=bias_correct,
            never_worse=never_worse,
            overwrite=overwrite,
            job=pairs,
            replace_nonfinite=replace_nonfinite,
            html_report=html_report,
            contrast=contrast,
        )
        merged = _merge_job(out, pairs, group, rank)
        if html_report and merged is not None:
            from hyperreg.apps.batch_report import write_report

            write_report(out)
    finally:
        if group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return BatchRun(
        report=report,
        rank=rank,
        world_size=world,
        total=len(pairs),
        merged=merged,
        model=resolved_model.path,
        bundled=resolved_model.bundled.name if resolved_model.bundled else None,
    )


def _merge_job(
    out: PathLike, pairs: Sequence[PairSpec], group: bool, rank: int
) -> tuple[Path, Path, int, int] | None:
    """Merge the job's records once this rank is done: with a process group, rank 0 between two
    barriers (every rank has finished; every rank exits together) and None elsewhere; without
    one, on every rank (idempotent)."""
    import torch

    if not group:
        return merge_records(out, pairs)
    torch.distributed.barrier()
    merged = merge_records(out, pairs) if rank == 0 else None
    torch.distributed.barrier()
    return merged
