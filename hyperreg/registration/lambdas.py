"""One pair at many λ in batched forward passes: the core of λ sweeps, λ* tuning and validation.

:func:`sweep_lambdas` repeats the pair K times and gives the model a λ tensor of shape ``(K,)``,
so the hypernetwork generates K weight sets **once** and the U-Net runs them as grouped
convolutions (:func:`hyperreg.method.layers.conv`); ``chunk`` bounds memory by running at most
that many λ per pass. On a CPU the default is one λ per pass: there a batch-1 convolution takes
PyTorch's fastest (oneDNN) path and 16 passes of one λ ran 1.2–1.7× faster than one pass of 16
(``benchmarks/RESULTS_hypernet.md``), and with more than one torch thread those one-λ passes
run side by side (:func:`map_lambda_chunks`). Grids and label maps are handled as in
:func:`hyperreg.registration.lambdas.register_pair` (same helpers). The engine
(:func:`hyperreg.registration.engine.run`) runs a one-pass model's network-only λ through it.
Must not import training, apps or cli.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from hyperreg._checks import as_lambda_tensor
from hyperreg.geometry.intensity import DEFAULT_NORMALIZATION
from hyperreg.geometry.io import Volume
from hyperreg.method.losses import ncc_loss
from hyperreg.method.metrics import input_labels, registration_dice
from hyperreg.method.model import HyperMorph
from hyperreg.registration.pairs import (
    RegistrationResult,
    network_inputs,
    prepare_pair,
    result_from_output,
    smoothness_of,
)

__all__ = [
    "labels_scored",
    "map_lambda_chunks",
    "one_thread_workers",
    "register_pair",
    "side_by_side",
    "staged_side_by_side",
    "sweep_lambdas",
]

logger = logging.getLogger(__name__)

_S = TypeVar("_S")
_T = TypeVar("_T")
_U = TypeVar("_U")


def side_by_side(
    fn: Callable[[_S], _T], items: Sequence[_S], device: torch.device | str = "cpu"
) -> list[_T]:
    """``[fn(item) for item in items]``, on a CPU with more than one torch thread computed side
    by side: one worker thread per torch thread (at most one per item), each on one torch
    thread, for work that spreads over threads less well than separate items do (a batch-1 3D
    forward pass, per-volume sampling). Each item's operations are the same as one at a time;
    memory is that of as many items at once. The torch thread count is restored afterwards;
    an error of an item is raised here.

    Args:
        fn: Thread-safe (it writes no shared state but through thread-safe appends, and
            switches on autograd or autocast, which are per thread, itself when it needs them).
        items: The inputs, in result order.
        device: Where ``fn`` computes; not a CPU: one at a time.

    Returns:
        ``fn``'s results in the order of ``items``.
    """
    workers = min(torch.get_num_threads(), len(items))
    if torch.device(device).type != "cpu" or workers < 2:
        return [fn(item) for item in items]
    with one_thread_workers(workers) as pool:
        return list(pool.map(fn, items))


@contextlib.contextmanager
def one_thread_workers(workers: int, *, caller_too: bool = True) -> Iterator[ThreadPoolExecutor]:
    """A pool of ``workers`` threads, each on one torch thread (torch's thread count is per
    thread: set in each worker as it starts), for work that runs side by side on the CPU's
    threads; with ``caller_too`` the calling thread is on one torch thread too while the pool
    is open (it only waits for the workers). The caller's torch thread count is set back when
    the pool closes, also where a worker's setting reached a pool of torch's that is
    process-wide."""
    threads = torch.get_num_threads()
    if caller_too:
        torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(workers, initializer=_one_torch_thread) as pool:
            yield pool
    finally:
        torch.set_num_threads(threads)


def _one_torch_thread() -> None:
    torch.set_num_threads(1)


def staged_side_by_side(
    first: Callable[[_S], _T],
    second: Callable[[_T], _U],
    items: Sequence[_S],
    device: torch.device | str = "cpu",
) -> list[_U] | None:
    """``[second(first(item)) for item in items]`` on one worker thread per torch thread (each
    on one torch thread), or None where :func:`side_by_side` would run one at a time (not a
    CPU, fewer than two threads or items): the caller then runs both stages its own way.

    Every ``first`` is queued before any ``second``; ``second`` of the first item runs once a
    worker is free after the last ``first`` was taken, alone (it may fill caches that the
    others read), and the other ``second`` calls are queued when it is done. So the
    ``second`` calls fill the threads that an uneven last round of ``first`` calls would leave
    idle (11 λ on two threads), and no ``first`` runs on more than one torch thread. Each
    call's operations are the same as one at a time; the torch thread count is restored
    afterwards and an error of any call is raised here.

    Args:
        first: The long stage (a λ's network passes); thread-safe as for :func:`side_by_side`.
        second: The stage that needs its item's ``first`` result (a λ's finishing).
        items: The inputs, in result order.
        device: Where both stages compute.

    Returns:
        ``second``'s results in the order of ``items``, or None (see above).
    """
    workers = min(torch.get_num_threads(), len(items))
    if torch.device(device).type != "cpu" or workers < 2:
        return None
    with one_thread_workers(workers) as pool:
        firsts = [pool.submit(first, item) for item in items]
        head = pool.submit(lambda: second(firsts[0].result())).result()
        rest = [pool.submit(lambda f=f: second(f.result())) for f in firsts[1:]]
        return [head, *(done.result() for done in rest)]


def map_lambda_chunks(
    run_chunk: Callable[[int], list[_T]], starts: Iterable[int], device: torch.device, step: int
) -> list[_T]:
    """``run_chunk(start)`` for every chunk start, the results joined in order; chunks of one
    λ (``step == 1``) on a CPU run :func:`side_by_side`. On the bundled 3D model the fields came
    out bitwise equal to one λ at a time on two threads.

    Args:
        run_chunk: Registers the λ chunk that starts at its argument (thread-safe, see
            :func:`side_by_side`).
        starts: Chunk starts, in result order.
        device: Where the model runs.
        step: λ per chunk.

    Returns:
        The chunks' results, concatenated in the order of ``starts``.
    """
    starts = list(starts)
    if step != 1:
        return [r for start in starts for r in run_chunk(start)]
    return [r for chunk in side_by_side(run_chunk, starts, device) for r in chunk]


def labels_scored(moving_seg: Volume | None, fixed_seg: Volume | None) -> list[int] | None:
    """Label ids scored in a sweep: non-zero ids of either input label map (the one convention,
    :func:`hyperreg.method.metrics.registration_dice`)."""
    if moving_seg is None or fixed_seg is None:
        return None
    return input_labels(moving_seg.data, fixed_seg.data)


@torch.no_grad()
def sweep_lambdas(
    model: HyperMorph,
    moving: Volume,
    fixed: Volume,
    lambdas: Sequence[float] | torch.Tensor,
    *,
    moving_seg: Volume | None = None,
    fixed_seg: Volume | None = None,
    chunk: int | None = None,
    amp: bool = False,
    normalization: str = DEFAULT_NORMALIZATION,
    resample: bool = False,
    ncc: bool = False,
    images: bool = True,
) -> list[RegistrationResult]:
    """Register one pair at every λ of ``lambdas`` in batched forward passes.

    The pair is repeated K times and run with a λ tensor of shape ``(K,)`` (per-sample generated
    weights, grouped convolutions), in passes of at most ``chunk`` values. Each result equals
    :func:`hyperreg.registration.lambdas.register_pair` at that λ up to float rounding (grouped and
    plain convolutions sum in a different order). Dice is scored on the non-zero labels of the
    **input** label maps (:func:`~hyperreg.method.metrics.registration_dice`), the same set for
    every λ (a label that vanishes scores 0 instead of dropping out of the mean). With ``ncc``,
    ``result.ncc`` holds the local NCC similarity
    (window 9, in [0, 1], float32) between the moved and the fixed image; ``result.smoothness``
    holds the training's smoothness term of the field; with label maps,
    ``result.dice_before`` holds the mean Dice without registration (same labels), as
    :func:`~hyperreg.registration.lambdas.register_pair` reports it.

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph`.
        moving: Moving image, on the fixed grid unless ``resample`` is True.
        fixed: Fixed image.
        lambdas: K values in [0, 1] (a sequence or a ``(K,)`` tensor), K >= 1, in any order.
        moving_seg: Optional moving label map (warped with nearest neighbour).
        fixed_seg: Optional fixed label map; with ``moving_seg`` it enables Dice.
        chunk: Largest number of λ per forward pass (bounds memory: activations grow linearly
            with it); None runs all K at once on a GPU and one per pass on a CPU (faster there).
        amp: Run the forward pass under bfloat16 autocast (CUDA only). Sampling, integration
            warps, metrics and outputs stay float32 or wider.
        normalization: Intensity normalisation, see
        :func:`hyperreg.geometry.intensity.normalize_intensity`.
        resample: Resample inputs not on the fixed grid onto it (see ``register_pair``).
        ncc: Also compute ``result.ncc`` per λ (box filters over the whole image; off unless
            asked for: it made a 3D sweep slower than single ``register_pair`` calls).
        images: False returns each field and its statistics only (see
            :func:`~hyperreg.registration.pairs.result_from_output`).

    Returns:
        One :class:`~hyperreg.registration.pairs.RegistrationResult` per λ, in the order given.

    Raises:
        TypeError: If ``lambdas`` is neither a sequence of numbers nor a tensor.
        ValueError: If ``lambdas`` is empty or has values outside [0, 1], ``chunk`` is not a
            positive integer, ``amp`` is asked for on a model that is not on CUDA, or the inputs
            are invalid as for ``register_pair``.
    """
    fn = "sweep_lambdas"
    device = next(model.parameters()).device
    lam_all = _lambda_values(fn, lambdas, device)
    count = lam_all.numel()
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"{fn}(): 'chunk' must be a positive integer or None, got {chunk!r}")
    if amp and device.type != "cuda":
        raise ValueError(
            f"{fn}(): 'amp' (bfloat16 autocast) needs a model on CUDA, got device '{device}'"
        )
    moving, moving_seg, fixed_seg, notes = prepare_pair(
        fn, model, moving, fixed, moving_seg, fixed_seg, resample=resample
    )
    labels = labels_scored(moving_seg, fixed_seg)
    before = None
    if labels is not None and moving_seg is not None and fixed_seg is not None:
        scores = registration_dice(moving_seg.data, fixed_seg.data, labels=labels)
        before = sum(scores.values()) / len(scores) if scores else float("nan")
    moving_t, fixed_t, grid = network_inputs(model, moving, fixed, normalization, device, notes)
    step = chunk or (1 if device.type == "cpu" else count)

    @torch.no_grad()
    def run_chunk(start: int) -> list[RegistrationResult]:
        lam = lam_all[start : start + step]
        size = lam.numel()
        shape = (size, *moving_t.shape[1:])
        context = torch.autocast("cuda", dtype=torch.bfloat16) if amp else contextlib.nullcontext()
        with context:
            out = model(moving_t.expand(shape), fixed_t.expand(shape), lam)
        similarity = None
        if ncc:
            similarity = -ncc_loss(out.moved.float(), fixed_t.expand(shape), reduction="none")
        smoothness = smoothness_of(model, out)
        results = []
        for index in range(size):
            result = result_from_output(
                out,
                index,
                float(lam[index]),
                moving_seg,
                fixed_seg,
                notes,
                labels,
                moving=moving,
                grid=grid,
                images=images,
            )
            if similarity is not None:
                result.ncc = float(similarity[index])
            result.smoothness = float(smoothness[index])
            if before is not None:
                result.dice_before = before
            results.append(result)
        logger.debug("%s(): λ %d-%d of %d done", fn, start + 1, start + size, count)
        return results

    return map_lambda_chunks(run_chunk, range(0, count, step), device, step)


def _lambda_values(
    fn: str, lambdas: Sequence[float] | torch.Tensor, device: torch.device
) -> torch.Tensor:
    """``lambdas`` as a checked ``(K,)`` float32 tensor on ``device`` (TypeError, ValueError
    as :func:`sweep_lambdas` documents)."""
    if isinstance(lambdas, torch.Tensor):
        lam_all = lambdas.detach().reshape(-1).to(torch.float32)
    elif isinstance(lambdas, Sequence) and not isinstance(lambdas, str):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in lambdas):
            raise TypeError(f"{fn}(): 'lambdas' must hold numbers, got {list(lambdas)[:4]}")
        lam_all = torch.tensor([float(v) for v in lambdas], dtype=torch.float32)
    else:
        raise TypeError(
            f"{fn}(): 'lambdas' must be a sequence of floats or a tensor, "
            f"got {type(lambdas).__name__}"
        )
    count = lam_all.numel()
    if count == 0:
        raise ValueError(f"{fn}(): 'lambdas' must hold at least one value, got none")
    return as_lambda_tensor(fn, lam_all, count, device)[:, 0]


def register_pair(
    model: HyperMorph,
    moving: Volume,
    fixed: Volume,
    lam: float,
    *,
    moving_seg: Volume | None = None,
    fixed_seg: Volume | None = None,
    normalization: str = DEFAULT_NORMALIZATION,
    resample: bool = False,
) -> RegistrationResult:
    """Register ``moving`` to ``fixed`` at λ = ``lam`` with one network pass on the model's
    device: :func:`sweep_lambdas` at that one λ (the engine's network path, the model's flip
    averaging included; no affine stage, no refinement, no verdict: for those, and the model's
    own passes, :meth:`~hyperreg.registration.pipeline.PreparedPair.register`).

    Registration is voxel-to-voxel on the fixed grid. With ``resample=True``, ``moving`` (linear
    interpolation) and ``moving_seg`` / ``fixed_seg`` (nearest neighbour, label ids preserved)
    are first resampled onto the fixed grid through their own affines when they are not on it
    (:func:`hyperreg.geometry.io.same_grid` false: shape, spacing, orientation or position differ),
    and ``RegistrationResult.resampled`` says which. Intensities are normalised after resampling.

    Args:
        model: A trained :class:`~hyperreg.method.model.HyperMorph` (its ``ndim`` must match).
        moving: Moving image, on the fixed grid unless ``resample`` is True.
        fixed: Fixed image.
        lam: λ in [0, 1].
        moving_seg: Optional moving label map (int32), on the grid of ``moving`` (or anywhere
            in world space with ``resample``), warped with nearest neighbour.
        fixed_seg: Optional fixed label map; with ``moving_seg`` it enables Dice (the labels
            of both maps, :func:`labels_scored`) and ``dice_before``.
        normalization: Intensity normalisation, see
            :func:`hyperreg.geometry.intensity.normalize_intensity`.
        resample: Resample inputs that are not on the fixed grid (default False: they are an
            error, as in :func:`hyperreg.geometry.io.check_same_grid`).

    Returns:
        A :class:`~hyperreg.registration.results.RegistrationResult`; every array is on the
        fixed grid.

    Raises:
        TypeError: If ``lam`` is not a number.
        ValueError: If the grids differ and ``resample`` is False, a label map is not on its
            image's grid (without ``resample``), the dimensionality does not match the model or
            between the images, or ``lam`` lies outside [0, 1].
    """
    try:
        value = None if isinstance(lam, bool) else float(lam)
    except (TypeError, ValueError):
        value = None
    if value is None:
        raise TypeError(f"register_pair(): 'lam' must be a number, got {type(lam).__name__}")
    return sweep_lambdas(
        model,
        moving,
        fixed,
        [value],
        moving_seg=moving_seg,
        fixed_seg=fixed_seg,
        normalization=normalization,
        resample=resample,
    )[0]
