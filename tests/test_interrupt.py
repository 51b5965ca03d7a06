"""Interrupted training (SIGTERM, Ctrl-C) writes a checkpoint that --resume continues; --init."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from hyperreg.config import ModelConfig, TrainConfig
from hyperreg.method.model import HyperMorph, load_checkpoint
from hyperreg.training.checkpointing import init_from_model, latest_checkpoint

SMALL = ModelConfig(enc_channels=(4, 8), dec_channels=(8, 8, 4), hyper_hidden=(8,), int_steps=3)
ROOT = Path(__file__).resolve().parents[1]


def _scans(folder: Path, count: int = 3, shape=(24, 28)) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        image = np.zeros(shape, np.float32)
        image[4:20, 5 + index : 22 + index] = rng.uniform(0.5, 1.0, (16, 17))
        nib.save(nib.Nifti1Image(image, np.eye(4)), folder / f"s{index}.nii.gz")
    return folder


def _logged_steps(run: Path) -> list[int]:
    log = run / "train_log.csv"
    if not log.is_file():
        return []
    with log.open() as handle:
        return [int(row["step"]) for row in csv.DictReader(handle) if row.get("step")]


@pytest.mark.parametrize(
    "signum",
    [
        pytest.param(signal.SIGTERM, marks=pytest.mark.slow),  # a training run: slow suite
        pytest.param(signal.SIGINT, marks=pytest.mark.slow),  # both alike
    ],
    ids=["sigterm", "sigint"],
)
def test_killed_run_checkpoints_and_resumes(tmp_path: Path, signum: int) -> None:
    data, run = _scans(tmp_path / "data"), tmp_path / "run"
    command = [
        sys.executable, "-m", "hyperreg", "train", "--data", str(data), "--out", str(run),
        "--steps", "100000", "--checkpoint-every", "100000", "--batch-size", "1",
        "--val-fraction", "0", "--test-fraction", "0", "--device", "cpu",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while len(_logged_steps(run)) < 5:
            assert process.poll() is None, process.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.05)
        signalled_at = max(_logged_steps(run))
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    message = stderr.decode()
    assert process.returncode == 128 + int(signum), message[-2000:]
    assert "--resume" in message and signal.Signals(signum).name in message
    stopped = max(_logged_steps(run))
    # the checkpoint holds the step the run stopped at: at most the step in flight was added
    checkpoint = latest_checkpoint(run)
    step = load_checkpoint(checkpoint)[1]["step"]
    assert step == stopped and signalled_at <= step <= signalled_at + 2
    final = step + 2
    resumed = subprocess.run(
        [*command[:6], "--resume", str(run), "--steps", str(final), "--device", "cpu",
         "--val-fraction", "0", "--test-fraction", "0", "--batch-size", "1"],
        env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    assert _logged_steps(run) == list(range(1, final + 1))  # nothing lost, nothing repeated
    assert load_checkpoint(run / "model.pt")[1]["step"] == final


def test_init_fine_tunes_from_pretrained_weights(tmp_path: Path) -> None:
    from hyperreg.training.train import train

    data = _scans(tmp_path / "data")
    common = {"data": str(data), "batch_size": 1, "device": "cpu", "checkpoint_every": 1000}
    pretrained = train(
        TrainConfig(out=str(tmp_path / "pre"), steps=3, model=SMALL, **common), progress=False
    )
    model = HyperMorph(SMALL)
    init_from_model(pretrained, model)
    reference = load_checkpoint(pretrained)[0].state_dict()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, reference[key], rtol=0, atol=0)
    # a fine-tuning run of 0 extra learning (lr tiny) stays close to the pretrained weights
    tuned = train(
        TrainConfig(out=str(tmp_path / "tuned"), steps=1, lr=1e-12, init=str(pretrained),
                    model=SMALL, **common),
        progress=False,
    )  # fmt: skip
    after = load_checkpoint(tuned)[0].state_dict()
    for key, value in after.items():
        torch.testing.assert_close(value, reference[key], rtol=1e-4, atol=1e-6)
    other = ModelConfig(**{**SMALL.__dict__, "int_steps": 5})
    with pytest.raises(ValueError, match="another architecture \\(int_steps: 3 in the model, 5"):
        init_from_model(pretrained, HyperMorph(other))


def test_cli_init_mismatch_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from hyperreg.cli import main

    data = _scans(tmp_path / "data")
    base = ["train", "--data", str(data), "--steps", "1", "--batch-size", "1", "--device", "cpu"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    model = str(tmp_path / "a" / "model.pt")
    code = main([*base, "--out", str(tmp_path / "b"), "--init", model, "--ndim", "3"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "ndim" in err, err
    assert not (tmp_path / "b" / "model.pt").exists()
    # without architecture flags the model's own are used
    assert main([*base, "--out", str(tmp_path / "c"), "--init", model]) == 0
