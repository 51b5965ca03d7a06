"""Per-step statistics read in blocks (as on a GPU): same logs and weights, NaN at its own step,
a stop signal honoured at the next read, and a resume that continues the run exactly."""

from __future__ import annotations

import csv
import os
import signal
from pathlib import Path

import pytest
import torch

import hyperreg.training.train as train_module
from hyperreg.config import ModelConfig, TrainConfig
from hyperreg.method.model import load_checkpoint
from hyperreg.training.checkpointing import TrainingInterrupted
from hyperreg.training.steplog import LOG_COLUMNS, StepRecord, StepStats
from hyperreg.training.train import train

# 3D: a NaN field reaches grid_sample in the step after a NaN loss, which PyTorch's 2D CPU kernel
# cannot take (hyperreg.method.spatial refuses it); the 3D kernel returns NaN
TINY = ModelConfig(ndim=3, enc_channels=(4, 4), dec_channels=(4, 4, 4), hyper_hidden=(8,),
                   int_steps=2)


class Pairs:
    """Random 16³ pairs; from call ``nan_from`` on, NaN images; a SIGTERM at call ``signal_at``."""

    def __init__(self, nan_from: int = 0, signal_at: int = 0) -> None:
        self.calls, self.nan_from, self.signal_at = 0, nan_from, signal_at

    def sample(self, batch_size: int, generator: torch.Generator):
        self.calls += 1
        if self.calls == self.signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        moving = torch.rand(batch_size, 1, 16, 16, 16, generator=generator)
        fixed = torch.rand(batch_size, 1, 16, 16, 16, generator=generator)
        if self.nan_from and self.calls >= self.nan_from:
            moving = moving * float("nan")
        return moving, fixed


def _config(out: Path, steps: int = 8, prefetch: bool = True) -> TrainConfig:
    return TrainConfig(out=str(out), steps=steps, batch_size=2, lr=1e-3, device="cpu",
                       model=TINY, checkpoint_every=100, seed=3, prefetch=prefetch)


def _losses(run: Path) -> list[tuple[str, ...]]:
    with (run / "train_log.csv").open() as handle:
        return [(row["step"], row["loss"], row["similarity"]) for row in csv.DictReader(handle)]


def _blocks(monkeypatch: pytest.MonkeyPatch, every: int) -> None:
    monkeypatch.setattr(train_module, "read_every", lambda device: every)


def test_step_stats_reads_a_block_in_order() -> None:
    stats = StepStats(3)
    for step in (1, 2):
        stats.add(step, torch.tensor([float(step), 0.5]), 0.1 * step)
        assert not stats.due()
    assert stats.due(force=True)
    stats.add(3, torch.tensor([3.0, 0.5]), 0.3)
    assert stats.due()
    assert stats.read() == [(1, [1.0, 0.5], 0.1), (2, [2.0, 0.5], 0.2), (3, [3.0, 0.5], 0.3)]
    assert stats.read() == [] and not stats.due(force=True)
    with pytest.raises(ValueError, match="'every' must be >= 1"):
        StepStats(0)


def test_step_record_names_the_packed_statistics() -> None:
    """A step's statistics packed on the device come back named, and log as LOG_COLUMNS."""
    stats = StepStats(2)
    for step, stop in ((1, False), (2, True)):
        packed = StepRecord.pack(
            torch.tensor(0.5, requires_grad=True), torch.tensor([1.0, 3.0]),
            torch.tensor([0.25, 0.75]), torch.tensor([0.0, 1.0]), stop,
        )
        assert packed.dtype == torch.float32 and packed.shape == (5,)
        stats.add(step, packed, 0.5 * step)
    first, second = (StepRecord.from_values(*row) for row in stats.read())
    assert first == StepRecord(1, 0.5, 2.0, 0.5, 0.5, False, 0.5)
    assert second.stop and second.finite and second.step == 2
    assert first.log_row() == [1, "0.5", "2", "0.5", "0.5000", "0.50"]
    assert len(first.log_row()) == len(LOG_COLUMNS)
    assert not StepRecord(3, float("nan"), 0.0, 0.0, 0.0, False, 0.0).finite


def test_block_reads_log_and_train_like_reads_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights, logs = [], []
    for every in (1, 3):  # 8 steps: reads at 3, 6 and the last step
        _blocks(monkeypatch, every)
        run = tmp_path / f"every{every}"
        model, _ = load_checkpoint(train(_config(run), pairs=Pairs(), progress=False))
        weights.append(model.state_dict())
        logs.append(_losses(run))
    assert logs[0] == logs[1] and [row[0] for row in logs[1]] == [str(s) for s in range(1, 9)]
    for key in weights[0]:
        torch.testing.assert_close(weights[0][key], weights[1][key], rtol=0, atol=0)


def test_block_reads_report_a_non_finite_loss_at_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _blocks(monkeypatch, 4)
    with pytest.raises(RuntimeError, match="loss became non-finite at step 3$"):
        train(_config(tmp_path), pairs=Pairs(nan_from=3), progress=False)
    assert [row[0] for row in _losses(tmp_path)] == ["1", "2"]  # nothing after the NaN is kept
    assert not list(tmp_path.glob("checkpoint_*.pt"))


def test_block_reads_stop_at_the_next_read_and_resume_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _blocks(monkeypatch, 4)
    run = tmp_path / "run"
    # drawn in the step's own thread, the signal lands during step 5 (with prefetch it would
    # land while step 4 runs: the prefetched draws are tests/test_prefetch.py's)
    with pytest.raises(TrainingInterrupted) as stopped:
        train(_config(run, steps=12, prefetch=False), pairs=Pairs(signal_at=5), progress=False)
    assert stopped.value.step == 8  # the signal came during step 5; the read after step 8 saw it
    assert (run / "checkpoint_0000008.pt").is_file()
    resumed, _ = load_checkpoint(
        train(_config(run, steps=12), pairs=Pairs(), progress=False, resume=run)
    )
    whole, _ = load_checkpoint(
        train(_config(tmp_path / "whole", steps=12), pairs=Pairs(), progress=False)
    )
    for key, value in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[key], value, rtol=0, atol=0)
    assert _losses(run) == _losses(tmp_path / "whole")
