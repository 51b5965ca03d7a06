"""Two processes (torchrun, gloo, CPU) with batch B match one process with batch 2B."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hyperreg.config import ModelConfig, TrainConfig
from hyperreg.training.distributed import DistributedContext, local_slice
from hyperreg.method.model import load_checkpoint
from hyperreg.training.train import train
from test_train import SMALL, BlobPairs

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_local_slice_partitions_the_global_batch() -> None:
    rows = [local_slice(DistributedContext(rank, 3), 2) for rank in range(3)]
    assert [list(range(12))[r] for r in rows] == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.slow  # a training run, subprocesses or benchmark runs: CI's slow step
@pytest.mark.skipif(not dist.is_gloo_available(), reason="torch built without gloo")
def test_two_gloo_processes_match_one_process(tmp_path: Path) -> None:
    steps, batch = 3, 2
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        str(HERE / "ddp_worker.py"),
        str(tmp_path / "ddp"),
        str(steps),
        str(batch),
    ]
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    single = TrainConfig(
        out=str(tmp_path / "single"),
        steps=steps,
        batch_size=2 * batch,
        seed=5,
        device="cpu",
        model=ModelConfig(**SMALL.__dict__),
    )
    expected = load_checkpoint(train(single, pairs=BlobPairs(), progress=False))[0].state_dict()
    got = load_checkpoint(tmp_path / "ddp" / "model.pt")[0].state_dict()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)
    # only rank 0 wrote: one log, with one row per step
    assert len((tmp_path / "ddp" / "train_log.csv").read_text().splitlines()) == steps + 1
