#!/usr/bin/env bash
# The one short prepared run for a GPU machine: the speed tables (hyperreg against voxelmorph and
# MONAI, hypernetwork overhead, training step, training loop, λ sweep, batch throughput) at full
# 3D size on CUDA, written to benchmarks/RESULTS_gpu.md with the device named; RESULTS.md links it.
# Needs a CUDA build of torch and the benchmark extra: pip install -e ".[bench]".
# About 5-10 minutes on one recent GPU. Extra arguments go to run_all.py (e.g. --device cuda:1).
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'run_gpu.sh: no CUDA device visible to torch')"
python benchmarks/run_all.py --device cuda "$@"
