"""OutputSpec and its one writer: every output has a writer; a new kind is one field + one entry."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from lambda_helpers import save_tiny_model, tiny_model, write_pair

import hyperreg.apps.outputs as outputs
from hyperreg.apps.outputs import OPTIONS, WRITERS, OutputSpec, write_outputs
from hyperreg.registration.pipeline import load_pair


@pytest.fixture
def registered(tmp_path: Path):
    """A tiny 2D pair through an affine stage, registered with its inverse."""
    paths = write_pair(tmp_path / "data", "a")
    model = tiny_model(2)
    pair = load_pair(paths["moving"], paths["fixed"], model=model, moving_seg=paths["moving_seg"])
    return pair, pair.register(model, [0.5], inverse=model.config.int_steps > 0)[0]


def test_every_output_field_has_a_writer_and_every_writer_a_field() -> None:
    names = {f.name for f in dataclasses.fields(OutputSpec)} - set(OPTIONS)
    assert names == set(WRITERS)
    assert set(OutputSpec().paths()) == names


def test_spec_from_cli_arguments_keeps_defaults_for_what_is_not_given() -> None:
    args = argparse.Namespace(moved="m.nii.gz", warp_out=None, warp_format="itk", other=1)
    spec = OutputSpec.from_args(args)
    assert spec.moved == "m.nii.gz" and spec.warp_out is None and spec.warp_format == "itk"
    assert OutputSpec.from_args(argparse.Namespace()) == OutputSpec()


def test_writes_every_given_output_and_only_those(tmp_path: Path, registered) -> None:
    pair, result = registered
    spec = OutputSpec(
        moved=tmp_path / "moved.nii.gz",
        moved_seg=tmp_path / "moved_seg.nii.gz",
        warp_out=tmp_path / "warp.nii.gz",
        affine_out=tmp_path / "affine.mat",
    )
    write_outputs(spec, result, pair)
    written = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert written == ["affine.mat", "moved.nii.gz", "moved_seg.nii.gz", "warp.nii.gz"]
    warp = nib.load(spec.warp_out).get_fdata()
    np.testing.assert_allclose(np.moveaxis(warp.reshape(*warp.shape[:2], 2), -1, 0), result.warp)


@pytest.mark.parametrize("threads", [1, 2])
def test_writers_use_no_more_threads_than_torch_is_given(
    tmp_path: Path, registered, monkeypatch, threads: int
) -> None:
    import hyperreg.apps.outputs as outputs_module

    pools: list[int] = []
    real = outputs_module.ThreadPoolExecutor

    def recording(workers, *args, **kwargs):
        pools.append(workers)
        return real(workers, *args, **kwargs)

    monkeypatch.setattr(outputs_module, "ThreadPoolExecutor", recording)
    pair, result = registered
    spec = OutputSpec(moved=tmp_path / "m.nii.gz", warp_out=tmp_path / "w.nii.gz",
                      moved_seg=tmp_path / "s.nii.gz")  # fmt: skip
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        write_outputs(spec, result, pair)
    finally:
        torch.set_num_threads(before)
    assert pools == ([] if threads == 1 else [2])  # three files: one thread, or two workers
    assert all(p.is_file() for p in spec.paths().values() if p is not None)


def test_a_new_output_kind_is_one_field_and_one_writer_entry(
    tmp_path: Path, registered, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What adding an output takes: a spec field and a WRITERS entry (outputs.py), nothing else
    in the writing path; the CLI option would be the second file."""
    pair, result = registered
    extended = dataclasses.make_dataclass(
        "ExtendedSpec", [("jacobian_out", object, None)], bases=(OutputSpec,), frozen=True
    )

    def write_jacobian(path, result, pair, spec):
        import torch

        from hyperreg.geometry.io import save_volume
        from hyperreg.method.spatial import jacobian_determinant

        jac = jacobian_determinant(torch.from_numpy(result.disp)[None]).reshape(
            pair.fixed.data.shape
        )
        return lambda: save_volume(path, jac.numpy(), pair.fixed)

    spec = extended(moved=tmp_path / "moved.nii.gz", jacobian_out=tmp_path / "jac.nii.gz")
    with pytest.raises(KeyError, match="jacobian_out"):  # no writer: refused before writing
        write_outputs(spec, result, pair)
    assert not any(tmp_path.glob("*.nii.gz"))
    monkeypatch.setitem(outputs.WRITERS, "jacobian_out", write_jacobian)
    write_outputs(spec, result, pair)
    assert (tmp_path / "jac.nii.gz").is_file() and (tmp_path / "moved.nii.gz").is_file()


def test_an_inverse_itk_field_the_moving_grid_cannot_hold_is_refused_before_any_write(
    tmp_path: Path, registered
) -> None:
    """A moving slice stored (I, J) outside the world x-y plane: ITK cannot read its field."""
    from types import SimpleNamespace

    from hyperreg.geometry.io import Volume

    pair, result = registered
    coronal = np.array([[1.0, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]])
    shape = pair.fixed.data.shape
    moving = Volume(np.zeros(shape, np.float32), coronal, shape)
    fake = SimpleNamespace(fixed=pair.fixed, moving=moving, chained=True, transform=pair.transform)
    inverse = np.zeros((2, *shape), np.float32)
    out = tmp_path / "out"
    out.mkdir()
    spec = OutputSpec(
        moved=out / "moved.nii.gz",
        inverse_warp_out=out / "inverse.nii.gz",
        warp_format="itk",
    )
    with pytest.raises(ValueError, match="x-y plane"):
        write_outputs(spec, dataclasses.replace(result, inverse_disp=inverse), fake)
    assert not any(out.iterdir())


def test_the_register_command_offers_every_output_and_passes_them_as_one_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each output field of OutputSpec is the dest of a ``register`` option, and the command
    hands register_files exactly OutputSpec.from_args of its arguments: an added output needs
    its field and writer here and its option in the CLI, nothing more."""
    from hyperreg.apps import register as register_app
    from hyperreg.cli import main
    from hyperreg.cli.messages import options_of
    from hyperreg.cli.run import build_parser

    options = options_of(build_parser(), "register")
    assert set(OutputSpec().paths()) | set(OPTIONS) <= set(options)
    seen: list[OutputSpec] = []

    def fake(model, moving, fixed, lam, *, outputs, **rest):
        seen.append(outputs)
        raise SystemExit(0)  # the spec is all this test looks at

    monkeypatch.setattr(register_app, "register_files", fake)
    paths = write_pair(tmp_path / "data", "a")
    model = tmp_path / "model.pt"
    save_tiny_model(model)
    args = ["register", "--model", str(model), "--moving", str(paths["moving"]), "--fixed",
            str(paths["fixed"]), "--moved", str(tmp_path / "moved.nii.gz"), "--field-out",
            str(tmp_path / "field.nii.gz"), "--warp-format", "itk"]  # fmt: skip
    with pytest.raises(SystemExit):
        main(args)
    (spec,) = seen
    assert spec == OutputSpec(
        moved=str(tmp_path / "moved.nii.gz"), field_out=str(tmp_path / "field.nii.gz"),
        warp_format="itk",
    )  # fmt: skip
