"""Exact resume: a run stopped at step k and resumed reaches the uninterrupted run's weights."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import torch

from hyperreg.training.checkpointing import TRAINING_STATE_KEY, latest_checkpoint
from hyperreg.config import ModelConfig, TrainConfig
from hyperreg.method.model import load_checkpoint
from hyperreg.training.train import train

from test_train import SMALL, BlobPairs


def _config(out: Path, steps: int, **kwargs) -> TrainConfig:
    values = {
        "out": str(out),
        "steps": steps,
        "batch_size": 2,
        "seed": 3,
        "device": "cpu",
        "model": SMALL,
        "checkpoint_every": 3,
        **kwargs,
    }
    return TrainConfig(**values)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)[0].state_dict()


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-6, atol=1e-7, msg=key)


@pytest.mark.parametrize("parametrization", ["mip", "default"])
def test_kill_and_resume_matches_uninterrupted(tmp_path: Path, parametrization: str) -> None:
    model = ModelConfig(**{**SMALL.__dict__, "parametrization": parametrization})
    # keep_checkpoints=0 keeps every checkpoint, also once the run has finished
    straight = train(
        _config(tmp_path / "straight", 6, model=model, keep_checkpoints=0), BlobPairs(),
        progress=False,
    )
    # "killed" after step 3: only the step-3 checkpoint survives in a fresh folder
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copy(tmp_path / "straight" / "checkpoint_0000003.pt", killed)
    resumed = train(_config(killed, 6, model=model), BlobPairs(), progress=False, resume=killed)
    _assert_same(_weights(straight), _weights(resumed))
    # a 3-step run, then extended to 6 steps in place
    short = tmp_path / "short"
    train(_config(short, 3, model=model), BlobPairs(), progress=False)
    extended = train(_config(short, 6, model=model), BlobPairs(), progress=False, resume=short)
    _assert_same(_weights(straight), _weights(extended))
    with (short / "train_log.csv").open() as handle:
        steps = [int(row["step"]) for row in csv.DictReader(handle)]
    assert steps == [1, 2, 3, 4, 5, 6]


class _Spy(BlobPairs):
    """BlobPairs that records the checkpoints present when each batch is drawn."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder, self.seen = folder, []

    def sample(self, batch_size: int, generator: torch.Generator):
        self.seen.append(sorted(p.name for p in self.folder.glob("checkpoint_*.pt")))
        return super().sample(batch_size, generator)


def test_checkpoints_keep_last_k_and_load_for_inference(tmp_path: Path) -> None:
    spy = _Spy(tmp_path)
    train(_config(tmp_path, 5, checkpoint_every=1, keep_checkpoints=2), spy, progress=False)
    assert spy.seen[-1] == ["checkpoint_0000003.pt", "checkpoint_0000004.pt"]
    names = sorted(p.name for p in tmp_path.glob("checkpoint_*.pt"))
    assert names == ["checkpoint_0000004.pt", "checkpoint_0000005.pt"]
    # a finished run: the older checkpoint keeps its weights but not the optimiser state
    old = tmp_path / "checkpoint_0000004.pt"
    assert "optimizer" not in torch.load(old, weights_only=True)[TRAINING_STATE_KEY]
    assert old.stat().st_size < 0.5 * (tmp_path / "checkpoint_0000005.pt").stat().st_size
    assert load_checkpoint(old)[1]["step"] == 4  # still loads for inference
    assert not list(tmp_path.glob(".*.tmp"))
    latest = latest_checkpoint(tmp_path)
    model, payload = load_checkpoint(latest)  # inference loader ignores the training state
    assert payload["step"] == 5 and TRAINING_STATE_KEY in payload
    _assert_same(model.state_dict(), _weights(tmp_path / "model.pt"))
    assert TRAINING_STATE_KEY not in load_checkpoint(tmp_path / "model.pt")[1]


def test_resume_rejects_mismatch(tmp_path: Path) -> None:
    train(_config(tmp_path, 3), BlobPairs(), progress=False)
    with pytest.raises(ValueError, match="already at step 3"):
        train(_config(tmp_path, 3), BlobPairs(), progress=False, resume=tmp_path)
    other = ModelConfig(**{**SMALL.__dict__, "int_steps": 3})
    with pytest.raises(ValueError, match="model config"):
        train(_config(tmp_path, 6, model=other), BlobPairs(), progress=False, resume=tmp_path)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        train(_config(tmp_path / "x", 6), BlobPairs(), progress=False, resume=tmp_path / "empty")


def test_cli_train_resume_without_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from test_data import _oasis_folder

    from hyperreg.cli import main

    data = _oasis_folder(tmp_path / "data", 2)
    run = tmp_path / "run"
    common = ["train", "--data", str(data), "--ndim", "2", "--device", "cpu"]
    assert main([*common, "--steps", "2", "--checkpoint-every", "1", "--out", str(run)]) == 0
    assert main([*common, "--steps", "3", "--resume", str(run)]) == 0
    assert load_checkpoint(run / "model.pt")[1]["step"] == 3
    assert sorted(p.name for p in run.glob("checkpoint_*.pt"))[-1] == "checkpoint_0000003.pt"
    assert main(["train", "--data", str(data), "--steps", "3"]) == 2
    assert "--out is required" in capsys.readouterr().err


def test_cli_resume_keeps_the_runs_settings(tmp_path: Path) -> None:
    """--resume without the original flags keeps checkpoint_every, init and the objective."""
    import json

    from test_data import _oasis_folder

    from hyperreg.cli import main

    data = _oasis_folder(tmp_path / "data", 2)
    run = tmp_path / "run"
    common = ["train", "--data", str(data), "--ndim", "2", "--device", "cpu"]
    first = [*common, "--steps", "2", "--checkpoint-every", "1", "--label-loss", "dice",
             "--label-weight", "0.5", "--init", "hypermorph-2d", "--out", str(run)]
    assert main(first) == 0
    assert main([*common, "--steps", "4", "--resume", str(run)]) == 0
    stored = json.loads((run / "config.json").read_text())
    assert stored["checkpoint_every"] == 1  # was rewritten to the default 500
    assert stored["init"].endswith("hypermorph-2d.pt")  # was rewritten blank
    assert (stored["label_loss"], stored["label_weight"]) == ("dice", 0.5)
    assert (run / "checkpoint_0000003.pt").is_file()  # checkpoints every step, as started
    objective = load_checkpoint(run / "model.pt")[0].objective
    assert (objective.label_loss, objective.label_weight) == ("dice", 0.5)


def test_cli_sets_mse_sigma_and_lambda_endpoints() -> None:
    from hyperreg.cli.run import build_parser
    from hyperreg.cli.train_args import train_settings

    args = build_parser().parse_args(
        ["train", "--data", "d", "--out", "o", "--sim", "mse", "--mse-sigma", "0.1",
         "--lam-endpoint-fraction", "0.5"]
    )
    config = train_settings(args)
    assert (config["sim"], config["mse_sigma"]) == ("mse", 0.1)
    assert config["lam_endpoint_fraction"] == 0.5


def test_cli_no_prefetch_turns_the_worker_off() -> None:
    from hyperreg.cli.run import build_parser
    from hyperreg.cli.train_args import train_settings

    base = ["train", "--data", "d", "--out", "o"]
    on = train_settings(build_parser().parse_args(base))
    off = train_settings(build_parser().parse_args([*base, "--no-prefetch"]))
    assert (on["prefetch"], off["prefetch"]) == (True, False)


def test_cli_cascade_every_reaches_the_config() -> None:
    from hyperreg.cli.run import build_parser
    from hyperreg.cli.train_args import train_settings

    base = ["train", "--data", "d", "--out", "o"]
    plain = train_settings(build_parser().parse_args(base))
    cascade = train_settings(build_parser().parse_args([*base, "--cascade-every", "2"]))
    assert (plain["cascade_every"], cascade["cascade_every"]) == (0, 2)
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--cascade-every", "-1"])
