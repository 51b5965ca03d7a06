"""Figures say what they show (issue 23 item 7): sweep curves with Dice before and after the
affine stage as two labelled lines, the montage's moving panel named after the affine stage,
and ``register --figure``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lambda_helpers import blob, write_nifti
from hyperreg.cli import main


@pytest.fixture()
def pair(tmp_path: Path) -> dict[str, Path]:
    shape = (64, 64)
    moving, fixed = blob(shape, (30, 34), 8.0), blob(shape, (33, 31), 9.0)
    return {
        "moving": write_nifti(tmp_path / "m.nii.gz", moving.astype(np.float32)),
        "fixed": write_nifti(tmp_path / "f.nii.gz", fixed.astype(np.float32)),
        "moving_seg": write_nifti(tmp_path / "ms.nii.gz", (moving > 0.5).astype(np.int16) * 2),
        "fixed_seg": write_nifti(tmp_path / "fs.nii.gz", (fixed > 0.5).astype(np.int16) * 2),
    }


def _args(pair: dict[str, Path]) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in pair.items()] + ["--device", "cpu"]


def test_sweep_curves_and_montage_name_the_baselines(pair, tmp_path, monkeypatch) -> None:
    import hyperreg.apps.sweep_figures as sweep

    seen: dict[str, object] = {"titles": []}
    curves, show = sweep.sweep_curves, sweep.show_slice

    def spy_curves(*args, **kwargs):
        seen.update(kwargs)
        return curves(*args, **kwargs)

    def spy_show(ax, view, title, *args, **kwargs):
        seen["titles"].append(title)  # type: ignore[union-attr]
        return show(ax, view, title, *args, **kwargs)

    monkeypatch.setattr(sweep, "sweep_curves", spy_curves)
    monkeypatch.setattr(sweep, "show_slice", spy_show)
    out = tmp_path / "sweep"
    assert main(["sweep", *_args(pair), "--lambdas", "0.1,0.5", "--out", str(out)]) == 0
    assert "baseline" not in seen
    assert isinstance(seen["dice_before"], float) and isinstance(seen["dice_affine"], float)
    assert "moving after the affine stage" in seen["titles"]  # type: ignore[operator]
    assert (out / "sweep_qc.png").is_file()


def test_register_figure(pair, tmp_path, capsys) -> None:
    figure = tmp_path / "figs" / "check.png"
    args = ["register", *_args(pair), "--lambda", "0.1", "--figure"]
    assert main([*args, str(figure)]) == 0
    assert figure.is_file() and figure.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()  # the first run's lines (its verdict may ask for a check)
    assert main([*args, str(tmp_path / "check.jpg")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--figure" in err and ".png" in err


def test_preload_pyplot_imports_it_with_agg_on_a_background_thread() -> None:
    """In a fresh interpreter: nothing of pyplot before, pyplot with the Agg backend after the
    returned (daemon) thread ends, so a later ``pyplot()`` finds it loaded."""
    import os
    import subprocess
    import sys

    code = (
        "import sys, threading\n"
        "from hyperreg.figures.backend import preload_pyplot\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
        "thread = preload_pyplot()\n"
        "assert isinstance(thread, threading.Thread) and thread.daemon\n"
        "thread.join(120)\n"
        "assert 'matplotlib.pyplot' in sys.modules\n"
        "import matplotlib\n"
        "assert matplotlib.get_backend().lower() == 'agg', matplotlib.get_backend()\n"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "MPLBACKEND": "TkAgg"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
