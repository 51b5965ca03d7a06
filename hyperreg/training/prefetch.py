"""Batches drawn one step ahead: a background thread prepares the next batch while a step runs.

:class:`Prefetcher` calls a draw function (in training: the global batch of pairs, then its λ,
from the run's ``torch.Generator``) in one background thread, one call ahead of its consumer,
so pair loading and synthesis (numpy and torch kernels, which release the GIL) overlap the
optimiser step on the main thread. The draws still happen one at a time and in order from the
one generator, so the sequence of results is exactly that of calling the draw function in the
loop; the generator state from which the next undelivered draw starts is kept for checkpoints
(:meth:`Prefetcher.position`), since the thread has already moved the generator on. The draw
function must take its randomness from that generator only: nothing else may touch it, or the
global torch / numpy / Python random states, while a draw runs. Must not import loop, train or
cli.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

import torch
from torch import Tensor

__all__ = ["THREAD_NAME", "Prefetcher"]

logger = logging.getLogger(__name__)

THREAD_NAME = "hyperreg-prefetch"  # prefix of the worker thread's name

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """Call ``draw`` ``count`` times, each call started in a background thread while the
    caller still works on the previous result.

    :meth:`next` returns the results in order. After returning result ``i`` it starts draw
    ``i + 1`` in the worker thread (unless ``ahead=False`` or all ``count`` draws are made), so
    at most one draw runs ahead; a draw not started ahead runs on the caller's thread when it
    is asked for. An exception raised by a draw is raised again, unchanged, by the
    :meth:`next` that asks for its result (with a note naming the thread), never swallowed.
    :meth:`close` (also on leaving a ``with`` block) waits for a draw in flight, ends the
    thread and sets the generator back to :meth:`position`, as if the unused draw had not been
    made. With ``enabled=False`` every draw runs in :meth:`next` and no thread is started.

    Args:
        draw: Makes one result, drawing its randomness from ``generator`` only.
        generator: The generator ``draw`` consumes; only the draws may use it until
            :meth:`close`.
        count: Number of draws to make (e.g. the steps left to train); none is made beyond.
        enabled: Draw ahead in a thread (False: each draw in :meth:`next`, same results).
        prepare: Called once in the worker thread before its first draw (e.g. to set its
            CUDA device and torch thread count, which are per thread).

    Raises:
        ValueError: If ``count`` is negative.
    """

    def __init__(
        self,
        draw: Callable[[], T],
        generator: torch.Generator,
        count: int,
        *,
        enabled: bool = True,
        prepare: Callable[[], None] | None = None,
    ) -> None:
        if count < 0:
            raise ValueError(f"Prefetcher(): 'count' must be >= 0, got {count}")
        self.draw = draw
        self.generator = generator
        self.count = count
        self.enabled = enabled
        self.prepare = prepare
        self.delivered = 0  # results returned by next()
        self._state: Tensor = generator.get_state()  # where the next undelivered draw starts
        self._pending: Future[tuple[T, Tensor]] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def _draw(self) -> tuple[T, Tensor]:
        """One draw and the generator state right after it (where the next draw starts)."""
        result = self.draw()
        return result, self.generator.get_state()

    def next(self, ahead: bool = True) -> T:
        """The next result; then, if ``ahead``, start the draw after it in the worker thread.

        Args:
            ahead: Start the following draw now (False: it runs when asked for, on the
                caller's thread; e.g. when files the draw may see are about to be written).

        Returns:
            Result number :attr:`delivered` (counting from 0) of ``draw``.

        Raises:
            RuntimeError: Once ``count`` results were delivered, or after :meth:`close`.
            Exception: Whatever the draw raised (the same exception).
        """
        if self.delivered >= self.count:
            raise RuntimeError(
                f"Prefetcher.next(): no draw left ({self.delivered} delivered, then closed or "
                "at 'count')"
            )
        if self._pending is None:
            result, state = self._draw()
        else:
            pending, self._pending = self._pending, None
            try:
                result, state = pending.result()
            except Exception as err:
                note = getattr(err, "add_note", None)  # Python >= 3.11
                if note is not None:
                    note(f"(raised in the '{THREAD_NAME}' thread, drawing ahead)")
                raise
        self.delivered += 1
        self._state = state
        if ahead and self.enabled and self.delivered < self.count:
            self._pending = self._worker().submit(self._draw)
        return result

    def _worker(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=THREAD_NAME, initializer=self.prepare
            )
        return self._pool

    def position(self) -> torch.Generator:
        """A new generator (on ``generator``'s device) at the state from which the next
        undelivered draw starts: what a checkpoint written now must hold, so that a run resumed
        from it draws exactly the results this one will deliver next."""
        position = torch.Generator(device=self.generator.device)
        position.set_state(self._state)
        return position

    def close(self) -> None:
        """Wait for a draw in flight (its result or error is dropped), end the worker thread
        and set the generator back to :meth:`position`. Idempotent."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self.generator.set_state(self._state)  # no-op unless a draw was made and not delivered
        self.count = self.delivered  # nothing more to draw

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
