"""hyperreg: HyperMorph deformable registration of brain MRI with a MIP hypernetwork.

One hypernetwork, conditioned on the regularisation weight λ (``lam``), generates every weight of
a VoxelMorph-style U-Net, so a single trained model registers a scan pair at any λ in [0, 1].

Conventions (fixed for the whole package):

* images ``moving``, ``fixed``, ``moved``: ``(B, C, *S)`` float32, ``S = (H, W)`` or ``(D, H, W)``;
* displacement ``disp``: ``(B, N, *S)`` with ``N = len(S)``, in voxels of the fixed grid, channel
  ``n`` along array axis ``n`` (i, j, k order, not x, y, z); ``moved[x] = moving(x + disp(x))``;
* velocity ``velocity``: same layout, voxels per unit time, integrated by scaling and squaring;
* λ in [0, 1]; loss(λ) = (1 − λ) · similarity + λ · smoothness;
* NIfTI affines travel with the data (:class:`hyperreg.geometry.io.Volume`) and every output
  carries the fixed image's affine; label maps are warped with nearest-neighbour interpolation.

Layers (each imports only those before it; ``tests/test_layout.py`` enforces it):
``_checks``, ``_files``, ``config`` and :mod:`hyperreg.figures` (matplotlib figures) →
:mod:`hyperreg.method` (the method: warp, losses, hypernetwork, U-Net, model),
:mod:`hyperreg.geometry` (files and geometry) and :mod:`hyperreg.pretrained` (the bundled
models) → :mod:`hyperreg.registration` (a model on one prepared pair) →
:mod:`hyperreg.training` → :mod:`hyperreg.apps` (files, sweeps, λ tuning, batches, demo) →
:mod:`hyperreg.cli`.

The names in ``__all__`` are the curated API, importable from ``hyperreg`` directly
(``from hyperreg import HyperMorph, load_checkpoint, register_files``). They are loaded on first
use, so importing the package has no side effects and stays fast: no device is chosen, nothing
is seeded, torch is not imported until a name that needs it is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ModelConfig": "hyperreg.config",
    "TrainConfig": "hyperreg.config",
    "HyperMorph": "hyperreg.method.model",
    "RegistrationOutput": "hyperreg.method.model",
    "load_checkpoint": "hyperreg.method.model",
    "save_checkpoint": "hyperreg.method.model",
    "HyperNetwork": "hyperreg.method.hypernet",
    "encode_lambda": "hyperreg.method.hypernet",
    "warp": "hyperreg.method.spatial",
    "integrate_velocity": "hyperreg.method.spatial",
    "jacobian_determinant": "hyperreg.method.spatial",
    "ncc_loss": "hyperreg.method.losses",
    "gradient_loss": "hyperreg.method.losses",
    "dice_per_label": "hyperreg.method.metrics",
    "folding_fraction": "hyperreg.method.metrics",
    "Volume": "hyperreg.geometry.io",
    "load_volume": "hyperreg.geometry.io",
    "save_volume": "hyperreg.geometry.io",
    "registration_dice": "hyperreg.method.metrics",
    "RegistrationResult": "hyperreg.registration.pairs",
    "register_pair": "hyperreg.registration.lambdas",
    "load_pair": "hyperreg.registration.pipeline",
    "PreparedPair": "hyperreg.registration.pipeline",
    "PairResult": "hyperreg.registration.pipeline",
    "resolve_model": "hyperreg.apps.models",
    "train": "hyperreg.training.train",
    "load_pretrained": "hyperreg.pretrained",
    "bundled_models": "hyperreg.pretrained",
    "register_files": "hyperreg.apps.register",
    "warp_file": "hyperreg.apps.fields",
    "sweep_files": "hyperreg.apps.sweep",
    "sweep_lambdas": "hyperreg.registration.lambdas",
    "tune_lambda": "hyperreg.apps.tune",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    """Load a curated name from its module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hyperreg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
