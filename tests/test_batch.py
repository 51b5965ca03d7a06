"""Batch registration: pair CSVs, a broken pair in the middle, resuming, sharding, torchrun."""

from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lambda_helpers import save_tiny_model, write_pair

from hyperreg.apps.batch import run_batch
from hyperreg.apps.inputs import PairSpec, read_pairs, shard
from hyperreg.cli import main

REPO = Path(__file__).resolve().parents[1]


def _write_csv(path: Path, rows: list[dict[str, object]]) -> Path:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture()
def job(tmp_path: Path) -> dict[str, Path]:
    """Five pairs (the middle one's moving image truncated), paths relative to the CSV."""
    data = tmp_path / "data"
    rows = []
    for index in range(5):
        paths = write_pair(data, f"p{index}", offset=0.5 * index)
        row: dict[str, object] = {k: p.name for k, p in paths.items()}
        row["lambda"] = "" if index % 2 else 0.2 * index
        rows.append(row)
    broken = data / "p2_moving.nii.gz"
    good_bytes = broken.read_bytes()
    (data / "p2_moving.good").write_bytes(good_bytes)
    raw = gzip.decompress(good_bytes)
    broken.write_bytes(gzip.compress(raw[: len(raw) // 2]))  # valid gzip, truncated NIfTI
    return {
        "csv": _write_csv(data / "pairs.csv", rows),
        "model": save_tiny_model(tmp_path / "model.pt"),
        "out": tmp_path / "out",
        "data": data,
    }


def _batch_args(job: dict[str, Path], *extra: str) -> list[str]:
    args = ["batch", "--model", str(job["model"]), "--pairs", str(job["csv"])]
    return [*args, "--out", str(job["out"]), "--no-progress", *extra]


def test_read_pairs(job: dict[str, Path]) -> None:
    pairs = read_pairs(job["csv"])
    assert len(pairs) == 5
    assert pairs[0].moving == job["data"] / "p0_moving.nii.gz"  # relative to the CSV
    assert pairs[0].lam == 0.0 and pairs[1].lam is None and pairs[4].lam == pytest.approx(0.8)
    assert pairs[3].name == "p3_moving__to__p3_fixed"  # the output folder: from the files


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("moving,seg\na,b\n", "header"),
        ("moving,fixed\n", "no pairs"),
        ("moving,fixed\na,\n", "both"),
        ("moving,fixed,lambda\na,b,1.5\n", r"\[0, 1\]"),
        ("moving,fixed,lambda\na,b,x\n", r"\[0, 1\]"),
    ],
)
def test_read_pairs_rejects(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_pairs(path)
    path.write_text("moving,fixed\na,b\n")
    with pytest.raises(ValueError, match="moving_seg"):
        read_pairs(path, require_segs=True)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_shards_cover_every_pair_once(world: int) -> None:
    pairs = [PairSpec(i, Path(f"m{i}"), Path(f"f{i}")) for i in range(11)]
    taken = [p.index for rank in range(world) for p in shard(pairs, rank, world)]
    assert sorted(taken) == list(range(11))
    with pytest.raises(ValueError, match="rank"):
        shard(pairs, world, world)


def test_batch_broken_pair_recorded_rest_done_rerun_skips(job: dict[str, Path], capsys) -> None:
    out = job["out"]
    assert main(_batch_args(job, "--lambda", "0.5")) == 1  # one pair failed
    captured = capsys.readouterr()
    assert "4 registered, 0 already done, 1 failed" in captured.out
    assert "1 pair(s) failed" in captured.err
    summary = _rows(out / "summary.csv")
    assert [int(r["index"]) for r in summary] == [0, 1, 3, 4]
    assert [float(r["lambda"]) for r in summary] == pytest.approx([0.0, 0.5, 0.5, 0.8])
    for row in summary:
        assert 0.0 <= float(row["mean_dice"]) <= 1.0 and row["dice_3"] and row["dice_4"]
        for key in ("moved", "warp", "moved_seg"):
            assert (out / row[key]).is_file()
    failures = _rows(out / "failures.csv")
    assert len(failures) == 1 and failures[0]["index"] == "2"
    assert "p2_moving.nii.gz" in failures[0]["error"]
    # the message itself, not the exception's class name (issue 23)
    assert "cannot read" in failures[0]["error"]
    assert not failures[0]["error"].startswith("ValueError")
    assert not (out / "pairs" / "p2_moving__to__p2_fixed" / "moved.nii.gz").exists()
    assert not list(out.rglob(".*.tmp"))  # no temporary files left behind
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.nii.gz")}

    # a rerun redoes nothing that finished (the broken pair is retried and fails again)
    assert main(_batch_args(job, "--lambda", "0.5")) == 1
    assert "0 registered, 4 already done, 1 failed" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.nii.gz")} == stamps

    # fix the file: only that pair runs, failures.csv empties
    (job["data"] / "p2_moving.nii.gz").write_bytes((job["data"] / "p2_moving.good").read_bytes())
    assert main(_batch_args(job, "--lambda", "0.5")) == 0
    assert "1 registered, 4 already done, 0 failed" in capsys.readouterr().out
    assert len(_rows(out / "summary.csv")) == 5 and _rows(out / "failures.csv") == []

    # another default λ changes rows without their own λ only: refused, then redone with
    # --overwrite
    assert main(_batch_args(job, "--lambda", "0.3")) == 2
    assert "2 of 5 pairs" in capsys.readouterr().err
    assert main(_batch_args(job, "--lambda", "0.3", "--overwrite")) == 0
    assert "2 registered, 3 already done" in capsys.readouterr().out


def test_batch_rows_without_lambda_take_the_model_default(job: dict[str, Path], capsys) -> None:
    """Issue 24: no --lambda is the model's default λ (here the fallback: the test model records
    none), recorded with its reason; a row's own λ is kept."""
    (job["data"] / "p2_moving.nii.gz").write_bytes((job["data"] / "p2_moving.good").read_bytes())
    assert main(_batch_args(job)) == 0
    rows = _rows(job["out"] / "summary.csv")
    defaulted = [r for r in rows if r["lambda_reason"] != "the row's lambda"]
    assert defaulted and len(defaulted) < len(rows)
    for row in defaulted:
        assert float(row["lambda_chosen"]) == pytest.approx(0.1)
        assert "fallback" in row["lambda_reason"]


def test_batch_simulated_ranks_cover_every_pair_once(job: dict[str, Path], monkeypatch) -> None:
    """RANK/WORLD_SIZE without MASTER_ADDR: shards alone, no process group (in-process)."""
    (job["data"] / "p2_moving.nii.gz").write_bytes((job["data"] / "p2_moving.good").read_bytes())
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    reports = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        reports.append(run_batch(job["model"], job["csv"], job["out"], lam=0.5).report)
    assert [r.done for r in reports] == [3, 2]
    summary = _rows(job["out"] / "summary.csv")
    assert [int(r["index"]) for r in summary] == [0, 1, 2, 3, 4]
    assert all(int(r["rank"]) == int(r["index"]) % 2 for r in summary)


@pytest.mark.slow  # a training run, subprocesses or benchmark runs: CI's slow step
def test_batch_torchrun_two_processes(job: dict[str, Path]) -> None:
    """A real 2-process run: ``python -m torch.distributed.run --nproc-per-node 2 -m hyperreg``."""
    (job["data"] / "p2_moving.nii.gz").write_bytes((job["data"] / "p2_moving.good").read_bytes())
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "hyperreg", *_batch_args(job, "--lambda", "0.5")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank 0/2: 3 registered" in done.stdout and "rank 1/2: 2 registered" in done.stdout
    summary = _rows(job["out"] / "summary.csv")
    assert [int(r["index"]) for r in summary] == [0, 1, 2, 3, 4]  # each pair exactly once
    assert [int(r["rank"]) for r in summary] == [0, 1, 0, 1, 0]
    records = sorted((job["out"] / "pairs").glob("*/record.json"))
    assert [json.loads(p.read_text())["index"] for p in records] == [0, 1, 2, 3, 4]


def test_batch_rerun_without_affine_stage_drops_the_old_affine(job: dict[str, Path]) -> None:
    """A rerun with --init none redoes the pairs and leaves no affine.mat of the earlier run."""
    out = job["out"]
    args = _batch_args(job, "--lambda", "0.5")
    main([*args, "--init", "affine"])
    assert list(out.glob("pairs/*/affine.mat"))
    main([*args, "--init", "none", "--overwrite"])
    assert not list(out.glob("pairs/*/affine.mat"))


def test_batch_summary_has_affine_and_unregistered_dice_and_prints_means(
    job: dict[str, Path], capsys
) -> None:
    """summary.csv has Dice before registration and of the affine stage beside the registered
    one, as register prints them; the command prints their means over the finished pairs."""
    (job["data"] / "p2_moving.nii.gz").write_bytes((job["data"] / "p2_moving.good").read_bytes())
    assert main(_batch_args(job, "--lambda", "0.5", "--init", "affine")) == 0
    rows = _rows(job["out"] / "summary.csv")
    for column in ("mean_dice", "dice_affine", "dice_before"):
        assert all(0.0 <= float(r[column]) <= 1.0 for r in rows), column
    registered = sum(float(r["mean_dice"]) for r in rows) / len(rows)
    before = sum(float(r["dice_before"]) for r in rows) / len(rows)
    assert registered > before  # the blobs are shifted: registration must help
    out = capsys.readouterr().out
    assert f"mean Dice {registered:.4f} over 5 pair(s) with label maps" in out
    assert f"before registration {before:.4f}" in out and "affine alone" in out


def test_batch_names_the_bundled_model_first_and_says_what_changed(
    job: dict[str, Path], capsys, caplog
) -> None:
    """Without --model the bundled model is named before any pair's message; a rerun with other
    settings (--overwrite) says which changed before it registers a pair again (a refined record
    is not taken for a --refine 0 one)."""
    args = ["batch", "--pairs", str(job["csv"]), "--out", str(job["out"]), "--no-progress"]
    assert main([*args, "--lambda", "0.5", "--refine", "2"]) == 1  # the broken pair
    captured = capsys.readouterr()
    assert captured.out.startswith("hyperreg batch: using the bundled model hypermorph-2d")
    caplog.clear()
    assert main([*args, "--lambda", "0.5", "--refine", "0", "--overwrite"]) == 1
    assert "4 registered, 0 already done, 1 failed" in capsys.readouterr().out
    changed = [r.getMessage() for r in caplog.records if "registered again" in r.getMessage()]
    assert len(changed) == 1 and changed[0].startswith("4 of 5 pairs registered again")
    assert "refine 2 ncc" in changed[0] and "-> none" in changed[0]


def test_batch_warnings_name_their_pair_and_are_kept_in_the_summary(
    job: dict[str, Path], caplog
) -> None:
    """A pair's warnings are logged with the pair's name and kept in its summary row."""
    import nibabel as nib
    import numpy as np

    fixed = job["data"] / "p3_fixed.nii.gz"
    image = nib.load(fixed)
    square = np.zeros(image.shape, np.float32)  # integer ids, piecewise constant: a label map
    square[tuple(slice(n // 4, 3 * n // 4) if n > 1 else slice(None) for n in image.shape)] = 1
    nib.save(nib.Nifti1Image(square, image.affine), fixed)
    main(_batch_args(job, "--lambda", "0.5"))
    rows = {r["name"]: r for r in _rows(job["out"] / "summary.csv")}
    assert "looks like a label map" in rows["p3_moving__to__p3_fixed"]["warnings"]
    assert rows["p0_moving__to__p0_fixed"]["warnings"] == ""
    logged = [r.getMessage() for r in caplog.records if "looks like a label map" in r.getMessage()]
    assert logged and all(m.startswith("p3_moving__to__p3_fixed: ") for m in logged)


def test_batch_records_a_constant_image_as_a_failed_pair_and_goes_on(
    job: dict[str, Path], caplog
) -> None:
    import nibabel as nib
    import numpy as np

    fixed = job["data"] / "p3_fixed.nii.gz"
    image = nib.load(fixed)
    nib.save(nib.Nifti1Image(np.zeros(image.shape, np.float32), image.affine), fixed)
    assert main(_batch_args(job, "--lambda", "0.5")) == 1
    failures = {r["index"]: r["error"] for r in _rows(job["out"] / "failures.csv")}
    assert sorted(failures) == ["2", "3"]  # pair 2: its truncated moving image
    assert f"'{fixed}' is constant (all voxels = 0.0)" in failures["3"]
    assert "nothing to register" in failures["3"] and "\n" not in failures["3"]
    summary = _rows(job["out"] / "summary.csv")
    assert [int(r["index"]) for r in summary] == [0, 1, 4]  # the batch went on
    assert not list((job["out"] / "pairs" / "p3_moving__to__p3_fixed").glob("*.nii.gz"))
    logged = [r.getMessage() for r in caplog.records if "is constant" in r.getMessage()]
    assert logged and all("p3_moving__to__p3_fixed failed" in m for m in logged)  # no warning first


def test_batch_says_up_front_which_pairs_name_missing_files_and_prints_the_lambda(
    job: dict[str, Path], capsys, caplog
) -> None:
    (job["data"] / "p2_moving.nii.gz").write_bytes((job["data"] / "p2_moving.good").read_bytes())
    (job["data"] / "p4_fixed.nii.gz").unlink()
    assert main(_batch_args(job, "--lambda", "0.5")) == 1
    messages = [r.getMessage() for r in caplog.records]
    first = next(i for i, m in enumerate(messages) if "do not exist" in m)
    assert "1 pair(s)" in messages[first] and "p4_moving__to__p4_fixed (row 4)" in messages[first]
    assert first < next(i for i, m in enumerate(messages) if "p4_moving__to__p4_fixed failed" in m)
    out = capsys.readouterr().out
    assert "λ = 0.5 for 2 pair(s): given for every row" in out  # rows 1 and 3 (the others own λ)
