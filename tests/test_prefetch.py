"""Prefetching: batches drawn a step ahead in a thread give the same run, resume exactly, and
errors and the thread's end behave."""

from __future__ import annotations

import csv
import os
import random
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from hyperreg.config import TrainConfig
from hyperreg.method.model import load_checkpoint
from hyperreg.training.batches import LambdaSampler, MixtureSampler, batch_of
from hyperreg.training.checkpointing import TrainingInterrupted, latest_checkpoint
from hyperreg.training.prefetch import THREAD_NAME, Prefetcher
from hyperreg.training.synth import SynthPairSampler
from hyperreg.training.train import train

from test_train import SMALL, BlobPairs
from test_synth import _label_map


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]


def _config(out: Path, steps: int, **kwargs) -> TrainConfig:
    values = {"out": str(out), "steps": steps, "batch_size": 2, "seed": 7, "device": "cpu",
              "model": SMALL, "checkpoint_every": 100, **kwargs}  # fmt: skip
    return TrainConfig(**values)


def _losses(run: Path) -> list[str]:
    with (run / "train_log.csv").open() as handle:
        return [row["loss"] for row in csv.DictReader(handle)]


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_checkpoint(a)[0].state_dict(), load_checkpoint(b)[0].state_dict()
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


class _Recorder:
    """A pair source that keeps what it gives, with the thread each draw ran on."""

    def __init__(self, source: object) -> None:
        self.source, self.batches, self.threads = source, [], []

    def sample_batch(self, batch_size: int, generator: torch.Generator):
        batch = batch_of(self.source, batch_size, generator)
        self.batches.append(batch)
        self.threads.append(threading.current_thread().name)
        return batch


def _mixed_source() -> MixtureSampler:
    """Blob pairs and SynthMorph-style pairs (MONAI transforms, numpy generators) on 32 × 32."""
    synth = SynthPairSampler([_label_map((32, 32), seed) for seed in range(2)], 2, max_labels=4)
    return MixtureSampler([BlobPairs(32), synth], [1.0, 1.0])


def test_prefetcher_delivers_the_draws_in_order_and_rewinds() -> None:
    generator = torch.Generator().manual_seed(3)
    expected = [torch.rand(4, generator=generator) for _ in range(5)]
    generator.manual_seed(3)
    calls = []

    def draw() -> torch.Tensor:
        calls.append(threading.current_thread().name)
        return torch.rand(4, generator=generator)

    with Prefetcher(draw, generator, count=5) as batches:
        got = [batches.next(), batches.next()]
        # the third draw already ran ahead in the thread; a checkpoint holds the state before it
        reference = torch.Generator().manual_seed(3)
        for _ in range(2):
            torch.rand(4, generator=reference)
        assert torch.equal(batches.position().get_state(), reference.get_state())
        got += [batches.next(ahead=False), batches.next(), batches.next()]
        with pytest.raises(RuntimeError, match="no draw left"):
            batches.next()
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert len(calls) == 5  # none beyond 'count'
    assert calls[0] == calls[3] == threading.current_thread().name  # not started ahead
    assert calls[1].startswith(THREAD_NAME) and calls[4].startswith(THREAD_NAME)
    assert not _prefetch_threads()
    # closing with a draw in flight puts the generator back where the next result starts
    generator.manual_seed(3)
    batches = Prefetcher(draw, generator, count=5)
    batches.next()
    batches.close()
    assert torch.equal(generator.get_state(), batches.position().get_state())
    assert torch.equal(torch.rand(4, generator=generator), expected[1])


def test_drawing_leaves_the_global_random_states_alone() -> None:
    """The prefetch thread draws while the step runs: neither may use the global states."""
    before = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    _mixed_source().sample_batch(4, torch.Generator().manual_seed(0))
    LambdaSampler(0.2).sample(4, torch.Generator().manual_seed(0))
    after = (torch.get_rng_state(), np.random.get_state()[1], random.getstate())
    assert torch.equal(before[0], after[0]) and np.array_equal(before[1], after[1])
    assert before[2] == after[2]


def test_same_batches_lambdas_and_losses_with_and_without_prefetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lams: list[torch.Tensor] = []
    sample = LambdaSampler.sample

    def recorded(self: LambdaSampler, n: int, generator: torch.Generator) -> torch.Tensor:
        lams.append(sample(self, n, generator))
        return lams[-1]

    monkeypatch.setattr(LambdaSampler, "sample", recorded)
    runs = {}
    for prefetch in (False, True):
        lams.clear()
        source = _Recorder(_mixed_source())
        config = _config(tmp_path / str(prefetch), 6, prefetch=prefetch, label_loss="dice",
                         checkpoint_every=4)  # fmt: skip
        runs[prefetch] = (train(config, source, progress=False), source, list(lams))
        assert not _prefetch_threads()  # the thread is gone once the run ends
    (plain, plain_source, plain_lams), (ahead, ahead_source, ahead_lams) = runs[False], runs[True]
    assert len(plain_source.batches) == len(ahead_source.batches) == 6  # none drawn beyond
    for a, b in zip(plain_source.batches, ahead_source.batches):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(torch.equal(a, b) for a, b in zip(plain_lams, ahead_lams))
    assert _losses(plain.parent) == _losses(ahead.parent)
    _assert_same_weights(plain, ahead)
    assert not any(name.startswith(THREAD_NAME) for name in plain_source.threads)
    # batches 2-4 and 6 are drawn ahead; batch 5 only after the step-4 checkpoint is written
    assert [name.startswith(THREAD_NAME) for name in ahead_source.threads] == [
        False, True, True, True, False, True
    ]  # fmt: skip
    assert '"prefetch": true' in (ahead.parent / "config.json").read_text()


class _StopAt(BlobPairs):
    """Blob pairs; drawing batch ``at`` sends this process SIGTERM (once)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.draws = at, 0

    def sample(self, batch_size: int, generator: torch.Generator):
        self.draws += 1
        if self.draws == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().sample(batch_size, generator)


def test_stopped_and_resumed_run_with_prefetch_equals_uninterrupted(tmp_path: Path) -> None:
    straight = train(_config(tmp_path / "straight", 8, prefetch=False), BlobPairs(),
                     progress=False)  # fmt: skip
    run = tmp_path / "stopped"
    with pytest.raises(TrainingInterrupted) as stopped:
        train(_config(run, 8), _StopAt(4), progress=False)
    # the signal arrives while batch 4 is drawn ahead, during step 3 (or just after it): the
    # checkpoint is written at a step where the thread has moved the generator on already
    step = stopped.value.step
    assert step in (3, 4) and latest_checkpoint(run).name == f"checkpoint_{step:07d}.pt"
    assert not _prefetch_threads()
    resumed = train(_config(run, 8), BlobPairs(), progress=False, resume=run)
    _assert_same_weights(straight, resumed)
    assert _losses(run) == _losses(straight.parent)


class _Failing(BlobPairs):
    """Blob pairs until draw ``at``, which raises (``error``) or gives NaN images (None)."""

    def __init__(self, at: int, error: Exception | None) -> None:
        super().__init__()
        self.at, self.error, self.draws = at, error, 0

    def sample(self, batch_size: int, generator: torch.Generator):
        self.draws += 1
        moving, fixed = super().sample(batch_size, generator)
        if self.draws == self.at:
            if self.error is not None:
                raise self.error
            moving = torch.full_like(moving, float("nan"))
        return moving, fixed


def test_errors_surface_in_the_main_thread_and_the_thread_ends(tmp_path: Path) -> None:
    # an error in a draw made ahead, in the thread: raised by train() as it is
    with pytest.raises(ValueError, match="the source broke at draw 3"):
        train(_config(tmp_path / "a", 6), _Failing(3, ValueError("the source broke at draw 3")),
              progress=False)  # fmt: skip
    assert not _prefetch_threads()
    # an error in the step while the thread draws: the thread ends too
    with pytest.raises(RuntimeError, match="non-finite"):
        train(_config(tmp_path / "b", 6), _Failing(2, None), progress=False)
    assert not _prefetch_threads()

