"""Worker for tests/test_distributed.py, run under ``python -m torch.distributed.run``.

Usage: ``ddp_worker.py OUT STEPS BATCH_PER_PROCESS [PARAMETRIZATION]``. Trains the tiny test model
on blob pairs with gloo on the CPU.
"""

from __future__ import annotations

import sys

import torch

from hyperreg.config import ModelConfig, TrainConfig
from hyperreg.training.train import train
from test_train import SMALL, BlobPairs

if __name__ == "__main__":
    torch.set_num_threads(1)
    out, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    parametrization = sys.argv[4] if len(sys.argv) > 4 else "mip"
    model = ModelConfig(**{**SMALL.__dict__, "parametrization": parametrization})
    config = TrainConfig(out=out, steps=steps, batch_size=batch, seed=5, device="cpu", model=model)
    train(config, pairs=BlobPairs(), progress=False)
