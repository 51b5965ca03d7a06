"""Errors about one argument raised in the apps carry it as data (``InputError.argument``), so
the command line names the option from argparse's ``dest`` rather than by rewriting text."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from hyperreg.apps.transforms import affine_files, check_transform_path, warp_files
from hyperreg.apps.sweep import sweep_files
from hyperreg.cli import main
from hyperreg.registration.pipeline import InputError


@pytest.fixture()
def image(tmp_path: Path) -> Path:
    path = tmp_path / "i.nii.gz"
    nib.save(nib.Nifti1Image(np.random.default_rng(0).random((8, 8)).astype(np.float32),
                             np.eye(4)), path)
    return path


def test_arguments_are_data(image: Path, tmp_path: Path) -> None:
    cases = [
        (lambda: check_transform_path("f", "affine_out", "a.nii.gz"), "affine_out"),
        (lambda: affine_files(image, image, init="similarity"), "init"),
        (lambda: affine_files(image, image, moved_seg=tmp_path / "s.nii.gz"), "moved_seg"),
        (lambda: warp_files([image], [tmp_path / "o.nii.gz"]), "warp_field"),
        (lambda: warp_files([image], [tmp_path / "o.nii.gz"], affine=tmp_path / "a.mat"),
         "fixed"),
        (lambda: sweep_files(None, image, image, [0.1, 0.1], tmp_path, save_fields=True),
         "lambdas"),
    ]
    for call, argument in cases:
        with pytest.raises(InputError) as info:
            call()
        assert info.value.argument == argument


def test_cli_names_the_option(image: Path, tmp_path: Path, capsys) -> None:
    args = ["warp", "--moving", str(image), "--affine", str(tmp_path / "a.mat")]
    assert main([*args, "--moved", str(tmp_path / "o.nii.gz")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hyperreg warp: error: argument --fixed: ") and "\n" not in err
