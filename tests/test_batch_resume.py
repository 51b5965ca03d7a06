"""Batch as a user meets it: folders named after the inputs (or the CSV's ``name`` column),
summary.csv as pairs finish, Ctrl-C that says how to resume, a rerun with other settings refused
without --overwrite, and output errors that name the file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from lambda_helpers import write_pair

from hyperreg._files import atomic_text, read_csv
from hyperreg.apps.inputs import read_pairs
from hyperreg.cli import main


def _rows(path: Path) -> list[dict[str, str]]:
    return read_csv("summary", path)[1]


@pytest.fixture()
def job(tmp_path: Path) -> dict[str, Path]:
    """Three tiny 2D pairs with label maps, in a CSV with paths relative to it."""
    data = tmp_path / "data"
    lines = ["moving,fixed,moving_seg,fixed_seg"]
    for index in range(3):
        paths = write_pair(data, f"s{index}", offset=0.5 * index)
        lines.append(
            ",".join(paths[k].name for k in ("moving", "fixed", "moving_seg", "fixed_seg"))
        )
    (data / "pairs.csv").write_text("\n".join(lines) + "\n")
    return {"csv": data / "pairs.csv", "data": data, "out": tmp_path / "out"}


def _args(job: dict[str, Path], *extra: str) -> list[str]:
    return ["batch", "--model", "hypermorph-2d", "--pairs", str(job["csv"]), "--out",
            str(job["out"]), "--lambda", "0.5", "--refine", "0", "--init", "none",
            "--device", "cpu", "--no-progress", *extra]  # fmt: skip


def test_pair_names_come_from_the_files(tmp_path: Path) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text(
        "moving,fixed,name\n"
        "subjA/mri/brain.mgz,subjB/mri/brain.mgz,\n"  # same file names: their folders added
        "subjC/mri/brain.mgz,subjB/mri/brain.mgz,\n"
        "raw/sub 01 (T1).nii.gz,raw/sub-02.npz,\n"  # characters unsafe in a folder name
        "raw/sub 01 (T1).nii.gz,raw/sub-02.npz,\n"  # the same two files again: -2
        "a.nii,b.nii,my-pair.1\n"
    )
    names = [pair.name for pair in read_pairs(path)]
    assert names == [
        "subjA_mri_brain__to__subjB_mri_brain",
        "subjC_mri_brain__to__subjB_mri_brain",
        "sub_01_T1__to__sub-02",
        "sub_01_T1__to__sub-02-2",
        "my-pair.1",
    ]


@pytest.mark.parametrize(
    ("name", "match"),
    [("../up", "line 2.*folder name"), ("a/b", "folder name"), (".hidden", "folder name")],
)
def test_a_bad_name_cell_is_an_error_naming_the_line(tmp_path: Path, name: str, match: str) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text(f"moving,fixed,name\na.nii,b.nii,{name}\n")
    with pytest.raises(ValueError, match=match):
        read_pairs(path)
    path.write_text("moving,fixed,name\na.nii,b.nii,x\nc.nii,d.nii,x\n")
    with pytest.raises(ValueError, match=r"line 3.*'x' is also row 0's"):
        read_pairs(path)


def test_folders_are_named_after_the_inputs_and_the_name_column(
    job: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    text = job["csv"].read_text().splitlines()
    job["csv"].write_text(
        "\n".join([text[0] + ",name", text[1] + ",", text[2] + ",second", text[3] + ","]) + "\n"
    )
    assert main(_args(job)) == 0
    folders = sorted(p.name for p in (job["out"] / "pairs").iterdir())
    assert folders == ["s0_moving__to__s0_fixed", "s2_moving__to__s2_fixed", "second"]
    rows = _rows(job["out"] / "summary.csv")
    assert [r["name"] for r in rows] == ["s0_moving__to__s0_fixed", "second", folders[1]]
    assert rows[1]["moved"] == "pairs/second/moved.nii.gz"
    assert (job["out"] / rows[1]["moved"]).is_file()
    capsys.readouterr()
    # rows reordered: each pair keeps its folder (the row number is not a setting)
    lines = job["csv"].read_text().splitlines()
    job["csv"].write_text("\n".join([lines[0], lines[3], lines[1], lines[2]]) + "\n")
    assert main(_args(job)) == 0
    assert "0 registered, 3 already done" in capsys.readouterr().out
    rows = _rows(job["out"] / "summary.csv")
    assert [r["name"] for r in rows] == [folders[1], "s0_moving__to__s0_fixed", "second"]
    assert [r["index"] for r in rows] == ["0", "1", "2"]


def test_an_interrupted_batch_has_a_summary_and_says_how_to_resume(
    job: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hyperreg.apps.batch as batch

    real, calls = batch._register_pair, []

    def once_then_ctrl_c(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(batch, "_register_pair", once_then_ctrl_c)
    assert main(_args(job)) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "hyperreg batch: interrupted after 1 of 3 pairs: rerun the same command to resume"
    )
    rows = _rows(job["out"] / "summary.csv")  # written as the first pair finished
    assert [r["name"] for r in rows] == ["s0_moving__to__s0_fixed"]
    assert (job["out"] / rows[0]["warp"]).is_file()
    assert not list(job["out"].rglob(".*tmp*"))  # nothing half-written
    monkeypatch.setattr(batch, "_register_pair", real)
    assert main(_args(job)) == 0  # the same command resumes
    assert "2 registered, 1 already done, 0 failed" in capsys.readouterr().out
    assert len(_rows(job["out"] / "summary.csv")) == 3


def test_an_interrupted_batch_counts_a_failed_pair_as_the_bar_does(
    job: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pair 1 registers, pair 2 fails, Ctrl-C during pair 3: two of three pairs were gone
    through (the progress bar's 2/3), one of them failed."""
    import hyperreg.apps.batch as batch

    real, calls = batch._register_pair, []

    def ok_fail_ctrl_c(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("a broken pair")
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(batch, "_register_pair", ok_fail_ctrl_c)
    assert main(_args(job)) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "hyperreg batch: interrupted after 2 of 3 pairs (1 failed, in failures.csv): rerun the "
        "same command to resume"
    )
    assert len(_rows(job["out"] / "summary.csv")) == 1
    assert len(_rows(job["out"] / "failures.csv")) == 1


def test_a_failed_pair_is_said_on_its_own_line_above_the_progress_bar(
    job: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hyperreg.apps.batch as batch

    real, calls = batch._register_pair, []

    def second_fails(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("a broken pair")
        return real(*args, **kwargs)

    monkeypatch.setattr(batch, "_register_pair", second_fails)
    with_bar = [a for a in _args(job) if a != "--no-progress"]
    assert main(with_bar) == 1
    err = capsys.readouterr().err
    assert "3/3" in err  # the bar was drawn
    said = [line for line in err.splitlines() if "a broken pair" in line]
    assert len(said) == 1
    # what the terminal shows of that line: after its last carriage return, the warning alone
    assert said[0].split("\r")[-1].startswith("hyperreg batch: warning: "), repr(said[0])


def test_a_rerun_with_another_lambda_is_refused_without_overwrite(
    job: dict[str, Path], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    assert main(_args(job)) == 0
    stamps = {p: p.stat().st_mtime_ns for p in job["out"].rglob("*") if p.is_file()}
    capsys.readouterr()
    again = [a if a != "0.5" else "0.3" for a in _args(job)]
    assert main(again) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    out = job["out"]
    assert err.startswith(f"hyperreg batch: error: argument --out: '{out}' holds 3 of 3 pairs")
    assert "lambda 0.5 -> 0.3" in err and "--overwrite" in err and "another --out" in err
    assert len(err) - len(str(out)) < 200, err  # short: the folder and what differs
    assert {p: p.stat().st_mtime_ns for p in job["out"].rglob("*") if p.is_file()} == stamps
    caplog.set_level("INFO")
    assert main([*again, "--overwrite"]) == 0
    assert "3 registered, 0 already done" in capsys.readouterr().out
    said = [r.getMessage() for r in caplog.records if "registered again" in r.getMessage()]
    assert len(said) == 1 and "3 of 3 pairs" in said[0] and "lambda 0.5 -> 0.3" in said[0]
    rows = _rows(job["out"] / "summary.csv")
    assert [float(r["lambda"]) for r in rows] == [0.3, 0.3, 0.3]


def test_no_space_left_names_the_file_and_stops(
    job: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hyperreg._files as files

    real = os.replace

    def full_disk(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if str(dst).endswith("warp.nii.gz") and "s1_" in str(dst):
            raise OSError(errno.ENOSPC, "No space left on device", str(src))
        real(src, dst)

    monkeypatch.setattr(files.os, "replace", full_disk)
    assert main(_args(job)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    target = job["out"] / "pairs" / "s1_moving__to__s1_fixed" / "warp.nii.gz"
    assert err[-1].startswith(f"hyperreg batch: error: [Errno 28] cannot write '{target}': ")
    assert "No space left on device" in err[-1] and "rerun" in err[-1]
    assert not (job["out"] / "pairs" / "s2_moving__to__s2_fixed").exists()  # stopped
    assert len(_rows(job["out"] / "summary.csv")) == 1  # the pair finished before
    assert not list(job["out"].rglob(".*tmp*"))


def test_a_failed_write_names_the_file(tmp_path: Path) -> None:
    def write(handle: object) -> None:
        raise OSError(errno.EDQUOT, "Disk quota exceeded", "/tmp/.x.tmp-1-ab.csv")

    with pytest.raises(OSError, match=r"cannot write '.*summary\.csv': Disk quota exceeded") as err:
        atomic_text(tmp_path / "summary.csv", write)
    assert err.value.errno == errno.EDQUOT
    assert list(tmp_path.iterdir()) == []  # no temporary file left


def test_merging_put_off_is_done_before_batch_register_returns(
    job: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of records make a merge slow; it is then put off, never skipped: the last
    pairs are merged before :func:`batch_register` returns (here every merge is put off)."""
    import hyperreg.apps.batch as batch
    from hyperreg import load_pretrained

    monkeypatch.setattr(batch._Merge, "soon", lambda self: setattr(self, "pending", True))
    pairs = read_pairs(job["csv"])
    report = batch.batch_register(
        load_pretrained(ndim=2), pairs, job["out"], lam=0.5, refine=None, init="none"
    )
    assert report.done == 3
    assert [r["name"] for r in _rows(job["out"] / "summary.csv")] == [p.name for p in pairs]
