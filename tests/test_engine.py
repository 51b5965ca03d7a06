"""The one inference engine (registration/engine.py) and its settings record
(registration/settings.py): the same numbers from every command, settings resolved once and
recorded, options a path cannot honour refused, a multi-pass model's λ batched."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from lambda_helpers import save_tiny_model, tiny_model, volume_pair, write_pair

from hyperreg._errors import InputError
from hyperreg.cli import main
from hyperreg.registration.pipeline import load_pair
from hyperreg.registration.refine import Refinement
from hyperreg.registration.settings import RegistrationSettings, resolve_settings


def _prepared() -> object:
    pair = volume_pair()
    return load_pair(
        pair["moving"], pair["fixed"], moving_seg=pair["moving_seg"],
        fixed_seg=pair["fixed_seg"], init="none",
    )  # fmt: skip


def test_a_two_pass_sweep_runs_each_pass_once_for_all_lambdas() -> None:
    """3 λ with chunk 3 and 2 passes: 2 forward calls (pass 1 for all, then pass 2), and each
    λ's field and Dice equal a register of that λ alone."""
    model, prepared = tiny_model(2), _prepared()
    calls: list[int] = []
    hook = model.register_forward_hook(lambda _m, args, _out: calls.append(args[0].shape[0]))
    lams = [0.1, 0.4, 0.8]
    raw = dict(passes=2, never_worse=False)  # an untrained model's fields, as given
    batched = prepared.register(model, lams, chunk=3, **raw)
    assert calls == [3, 3]
    calls.clear()
    singles = [prepared.register(model, [lam], **raw)[0] for lam in lams]
    assert calls == [1, 1] * 3
    hook.remove()
    moved = 0.0
    for many, one in zip(batched, singles):
        np.testing.assert_allclose(many.disp, one.disp, atol=1e-4)
        assert many.dice is not None and one.dice is not None
        for label, value in one.dice.items():
            assert many.dice[label] == pytest.approx(value, abs=1e-6)
        moved = max(moved, float(np.abs(one.disp).max()))
    assert moved > 0.05  # the fields are not all zero


def test_lambdas_side_by_side_on_cpu_threads_give_the_one_at_a_time_results() -> None:
    """With two torch threads, one λ per chunk runs on worker threads (one torch thread
    each): the same fields, Dice and statistics as one λ at a time on one thread, in the order
    asked, for a two-pass and a one-pass model; the thread count comes back."""
    import threading

    import torch

    prepared = _prepared()
    lams = [0.9, 0.1, 0.5, 0.3, 0.7]
    raw = dict(never_worse=False, ncc=True)
    seen: set[int] = set()
    for passes in (2, 1):
        model = tiny_model(2)
        hook = model.register_forward_hook(lambda *_: seen.add(threading.get_ident()))
        saved = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            singles = [prepared.register(model, [lam], passes=passes, **raw)[0] for lam in lams]
            torch.set_num_threads(2)
            seen.clear()
            together = prepared.register(model, lams, passes=passes, **raw)
            assert torch.get_num_threads() == 2  # restored
        finally:
            torch.set_num_threads(saved)
            hook.remove()
        # on the workers (at most two; a fast one may take every λ), never this thread
        assert 1 <= len(seen) <= 2 and threading.get_ident() not in seen
        assert [r.lam for r in together] == pytest.approx(lams)
        for many, one in zip(together, singles):
            np.testing.assert_allclose(many.disp, one.disp, atol=1e-6)
            assert many.dice == pytest.approx(one.dice, abs=1e-9)
            assert many.folding_fraction == pytest.approx(one.folding_fraction, abs=1e-12)
            assert many.ncc == pytest.approx(one.ncc, abs=1e-6)
        assert float(np.abs(together[0].disp - together[1].disp).max()) > 0.05  # λ differ


def test_staged_side_by_side_queues_every_first_stage_before_the_second() -> None:
    """On two torch threads: every first stage is taken before any second stage starts, the
    first item's second stage runs alone before the others, both stages on the workers at one
    torch thread each; results in order, the thread count restored; one thread: None."""
    import threading

    import torch

    from hyperreg.registration.lambdas import staged_side_by_side

    events: list[tuple[str, int]] = []
    lock = threading.Lock()

    def note(stage: str, item: int) -> None:
        with lock:
            events.append((stage, item))
        assert threading.get_ident() != main and torch.get_num_threads() == 1

    def first(item: int) -> int:
        note("first", item)
        return item * 10

    def second(value: int) -> int:
        note("start", value // 10)
        out = value + 1
        note("end", value // 10)
        return out

    main = threading.get_ident()
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert staged_side_by_side(first, second, range(5)) == [1, 11, 21, 31, 41]
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        assert staged_side_by_side(first, second, range(5)) is None
    finally:
        torch.set_num_threads(saved)
    assert len(events) == 15  # five of each stage; none from the one-thread call
    head, done = events.index(("start", 0)), events.index(("end", 0))
    # queued behind every first stage: at most the other worker's last one is still running
    assert sum(stage == "first" for stage, _ in events[:head]) >= 4
    assert not any(stage == "start" for stage, _ in events[head + 1 : done])  # alone
    assert sorted(item for stage, item in events[done + 1 :] if stage == "start") == [1, 2, 3, 4]


def test_settings_are_resolved_once_and_carried_by_every_result() -> None:
    model, prepared = tiny_model(2), _prepared()
    refine = Refinement(steps=3, lr=0.1)
    results = prepared.register(model, [0.2, 0.6], refine, passes=2, never_worse=False)
    for result in results:
        settings = result.settings
        assert isinstance(settings, RegistrationSettings)
        assert settings.lams == (0.2, 0.6) and settings.passes == 2
        assert settings.refinement == dataclasses.replace(refine, sim="ncc")  # the model's
        assert settings.device == "cpu"
        assert result.refinement is not None and result.refinement.steps > 0
    record = results[0].settings.as_dict()
    assert json.loads(json.dumps(record))["refinement"]["steps"] == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        results[0].settings.passes = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        (dict(amp=True, refinement=Refinement(steps=5)), "amp"),
        (dict(amp=True), "amp"),  # a CPU model
        (dict(passes=0), "passes"),
        (dict(chunk=0), "chunk"),
        (dict(passes=2, inverse=True), "inverse"),
        (dict(chunk=2, refinement=Refinement(steps=5)), "chunk"),  # one λ at a time
        (dict(chunk=2, inverse=True), "chunk"),
    ],
)
def test_an_option_a_path_cannot_honour_is_an_error_naming_it(options: dict, argument: str) -> None:
    with pytest.raises(InputError) as caught:
        resolve_settings(tiny_model(2), [0.3], **options)
    assert caught.value.argument == argument


def test_sweep_with_amp_and_refinement_is_refused_before_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = save_tiny_model(tmp_path / "model.pt")
    files = write_pair(tmp_path, "p")
    out = tmp_path / "sweep"
    args = ["sweep", "--model", str(model), "--moving", str(files["moving"]), "--fixed",
            str(files["fixed"]), "--out", str(out), "--lambdas", "0.2,0.6", "--device", "cpu",
            "--init", "none", "--amp", "--refine", "5"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--amp" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_sweep_chunk_with_refinement_is_refused_before_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--chunk bounds batched network passes; refinement runs each λ alone: one line naming
    --chunk, nothing written; --refine 0 takes it."""
    model = save_tiny_model(tmp_path / "model.pt")
    files = write_pair(tmp_path, "p")
    out = tmp_path / "sweep"
    args = ["sweep", "--model", str(model), "--moving", str(files["moving"]), "--fixed",
            str(files["fixed"]), "--out", str(out), "--lambdas", "0.2,0.6", "--device", "cpu",
            "--init", "none", "--chunk", "2"]  # fmt: skip
    assert main([*args, "--refine", "5"]) == 2
    err = capsys.readouterr().err
    assert "--chunk" in err and "--refine" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert main([*args, "--refine", "0"]) == 0
    assert (out / "sweep.csv").exists()


def test_register_sweep_and_batch_give_the_same_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One pair at λ 0.3 through register, sweep and batch: the same field, Dice and folding;
    batch's record and register -v carry the settings."""
    model = save_tiny_model(tmp_path / "model.pt")
    files = write_pair(tmp_path, "p")
    common = ["--model", str(model), "--device", "cpu", "--init", "none", "--keep-worse"]
    pair = [f"--{key.replace('_', '-')}={path}" for key, path in files.items()]
    warp = tmp_path / "warp.nii.gz"
    assert main(["register", *common, *pair, "--lambda", "0.3", "--warp", str(warp), "-v"]) == 0
    said = capsys.readouterr().out
    assert "settings: passes 1" in said
    sweep = tmp_path / "sweep"
    args = ["sweep", *common, *pair, "--lambdas", "0.3", "--save-fields", "--out", str(sweep)]
    assert main(args) == 0
    table = tmp_path / "pairs.csv"
    table.write_text(
        "moving,fixed,moving_seg,fixed_seg\n"
        f"{files['moving']},{files['fixed']},{files['moving_seg']},{files['fixed_seg']}\n"
    )
    batch = tmp_path / "batch"
    args = ["batch", *common, "--pairs", str(table), "--out", str(batch), "--lambda", "0.3"]
    assert main([*args, "--no-progress"]) == 0
    capsys.readouterr()
    field = np.asarray(nib.load(warp).dataobj)
    np.testing.assert_allclose(
        np.asarray(nib.load(sweep / "warp_lam0.3.nii.gz").dataobj), field, atol=1e-5
    )
    assert np.abs(field).max() > 0.05
    (record_path,) = (batch / "pairs").glob("*/record.json")
    record = json.loads(record_path.read_text())
    with (sweep / "sweep.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert float(row["mean_dice"]) == pytest.approx(record["mean_dice"], abs=1e-5)
    assert float(row["folding_percent"]) == pytest.approx(record["folding_percent"], abs=1e-6)
    assert record["settings"]["lams"] == [0.3] and record["settings"]["passes"] == 1


def test_training_validation_scores_as_register_does() -> None:
    """Validation registers through the engine with the model's own passes and scores with
    registration_dice: its Dice is register's for the same pair; its loss includes the label
    term of a model trained with one."""
    from hyperreg.training.holdout import ValidationPair
    from hyperreg.training.validation import evaluate

    model = tiny_model(2)
    model.config = dataclasses.replace(model.config, passes=2)
    pair = volume_pair()
    held = ValidationPair(
        "p", *(pair[k].data for k in ("moving", "fixed", "moving_seg", "fixed_seg"))
    )
    row = evaluate(model, [held], [0.3])
    prepared = load_pair(
        pair["moving"], pair["fixed"], moving_seg=pair["moving_seg"],
        fixed_seg=pair["fixed_seg"], init="none", normalization="none",
    )  # fmt: skip
    (registered,) = prepared.register(model, [0.3], never_worse=False, judged=False)
    assert registered.settings.passes == 2
    assert row["dice_0.3"] == pytest.approx(registered.mean_dice, abs=1e-6)
    assert row["folding_pct_0.3"] == pytest.approx(100 * registered.folding_fraction, abs=1e-9)
    model.objective = dataclasses.replace(model.objective, label_loss="dice", label_weight=1.0)
    labelled = evaluate(model, [held], [0.3])
    assert labelled["dice_0.3"] == pytest.approx(row["dice_0.3"], abs=1e-9)
    assert labelled["loss_0.3"] > row["loss_0.3"] + 1e-4  # the label term counts


def test_an_mse_model_refines_with_mse_unless_told() -> None:
    model, prepared = tiny_model(2), _prepared()
    model.objective = dataclasses.replace(model.objective, similarity="mse")
    raw = dict(never_worse=False)
    (own,) = prepared.register(model, [0.3], Refinement(steps=3, lr=0.1), **raw)
    assert own.settings.refinement.sim == "mse" and own.refinement.similarity == "mse"
    told = Refinement(steps=3, lr=0.1, sim="ncc")
    (ncc,) = prepared.register(model, [0.3], told, **raw)
    assert ncc.settings.refinement.sim == "ncc" and ncc.refinement.similarity == "ncc"
    assert np.abs(own.disp - ncc.disp).max() > 1e-4  # another objective, another field
    assert resolve_settings(model, [0.3], Refinement(), refine_sim="mi").refinement.sim == "mi"


def test_the_similarity_choices_come_from_one_registry() -> None:
    from hyperreg.method.objective import SIMILARITIES
    from hyperreg.method.similarities import REFINE_SIMILARITIES, TRAIN_SIMILARITIES
    from hyperreg.training.train import SIMILARITIES as TRAINED

    assert set(SIMILARITIES) >= set(REFINE_SIMILARITIES) >= set(TRAIN_SIMILARITIES)
    assert set(SIMILARITIES) - set(REFINE_SIMILARITIES) == {"ngf"}  # judges only
    assert TRAINED == TRAIN_SIMILARITIES
    with pytest.raises(InputError) as caught:
        resolve_settings(tiny_model(2), [0.3], Refinement(sim="ssd"))
    assert caught.value.argument == "sim"
