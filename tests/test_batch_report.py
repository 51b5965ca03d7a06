"""``batch --report``: the batch page lists every pair (failed ones and those to check first),
its links resolve, pair pages show one plane in 2D and three in 3D, an interrupted batch's
report lists the finished pairs; in headless Chromium (skipped, saying so, where it is absent)
the page renders, sorting a column reorders the rows and the flicker switches the image."""

from __future__ import annotations

import csv
import gzip
import io
import re
from pathlib import Path
from urllib.parse import unquote

import nibabel as nib
import numpy as np
import pytest
from browser import CHROMIUM_MISSING, Browser, chromium
from lambda_helpers import save_tiny_model, write_pair
from shared_paths import data_path

from hyperreg.apps.batch_report import pair_page, write_report
from hyperreg.cli import main
from hyperreg.figures.planes import pair_planes

needs_chromium = pytest.mark.skipif(chromium() is None, reason=CHROMIUM_MISSING)


def _write_csv(path: Path, rows: list[dict[str, object]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture()
def batch(tmp_path: Path) -> dict[str, Path]:
    """A finished ``batch --report`` of four pairs, the third one broken (truncated file)."""
    data = tmp_path / "data"
    rows = []
    for index in range(4):
        paths = write_pair(data, f"p{index}", offset=0.7 * index)
        rows.append({k: p.name for k, p in paths.items()})
    broken = data / "p2_moving.nii.gz"
    raw = gzip.decompress(broken.read_bytes())
    broken.write_bytes(gzip.compress(raw[: len(raw) // 2]))
    csv_path = _write_csv(data / "pairs.csv", rows)
    out = tmp_path / "out"
    args = ["batch", "--model", str(save_tiny_model(tmp_path / "model.pt")), "--pairs"]
    args += [str(csv_path), "--out", str(out), "--no-progress", "--lambda", "0.5", "--report"]
    assert main(args) == 1  # one pair failed, the rest done
    return {"out": out, "csv": csv_path, "args": args}  # type: ignore[dict-item]


def _rows(page: str) -> list[str]:
    return re.findall(r"<tr class=(\w+) data-name='([^']+)'", page)


def test_report_lists_every_pair_and_its_links_resolve(batch: dict[str, Path]) -> None:
    out = batch["out"]
    page = (out / "report.html").read_text()
    rows = _rows(page)
    assert len(rows) == 4  # three registered, one failed
    assert rows[0][0] == "failed" and rows[0][1].startswith("p2_")  # failed first
    assert {name for _, name in rows} == {p.name for p in (out / "pairs").iterdir()}
    links = re.findall(r"href='([^']+)'", page)
    assert len(links) == 3  # the failed pair has no page
    for link in links:
        target = out / unquote(link)
        assert target.is_file()
        pair = target.read_text()
        assert pair.count("class=plane ") == 1  # a 2D pair: its one plane
        images = re.findall(r"src='data:image/(\w+);base64,", pair)
        assert sorted(images[:2]) == ["webp", "webp"] and images[2] == "png"  # fixed, moved, layer
        back = re.search(r"href='([^']+)'", pair).group(1)
        assert (target.parent / back).resolve() == (out / "report.html").resolve()
    assert "http" not in page.replace("http-equiv", "")  # nothing fetched


def test_pairs_to_check_come_first_and_the_report_is_rewritten_from_the_summary(
    batch: dict[str, Path],
) -> None:
    out = batch["out"]
    with (out / "summary.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        columns, rows = reader.fieldnames, list(reader)
    rows[-1]["verdict"] = "check: Dice after registration below the affine's"
    with (out / "summary.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    # which other pairs the untrained model leaves to check depends on the affine stage (a
    # pair kept as it came is one); the page must follow the summary's verdicts, checks first
    verdicts = {row["name"]: row["verdict"] for row in rows}
    checks = sum(v.startswith("check") for v in verdicts.values())
    assert any(not v.startswith("check") for v in list(verdicts.values())[:-1])  # one to pass
    before = {p: p.stat().st_mtime_ns for p in out.glob("pairs/*/report.html")}
    page = _rows(write_report(out).read_text())
    assert [css for css, _ in page] == ["failed"] + ["check"] * checks + ["ok"] * (
        len(verdicts) - checks
    )
    assert all(css == verdicts[name].split(":")[0] for css, name in page[1:])
    after = {p: p.stat().st_mtime_ns for p in out.glob("pairs/*/report.html")}
    assert after == before  # pair pages newer than their records are kept


def test_three_planes_for_a_3d_pair_with_label_borders(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    shape = (20, 24, 16)
    affine = np.diag([1.0, 1.0, 2.0, 1.0])  # 2 mm slices: sagittal/coronal views are taller
    fixed = rng.random(shape).astype(np.float32)
    seg = (fixed > 0.5).astype(np.int16)
    folder = tmp_path / "out" / "pairs" / "a__to__b"
    folder.mkdir(parents=True)
    for name, data in (("moved", fixed[::-1]), ("fixed", fixed), ("moved_seg", seg[::-1])):
        nib.save(nib.Nifti1Image(data, affine), folder / f"{name}.nii.gz")
    nib.save(nib.Nifti1Image(seg, affine), tmp_path / "fixed_seg.nii.gz")
    row = {"name": "a__to__b", "index": "0", "fixed": str(folder / "fixed.nii.gz"),
           "moved": "pairs/a__to__b/moved.nii.gz", "moved_seg": "pairs/a__to__b/moved_seg.nii.gz",
           "fixed_seg": str(tmp_path / "fixed_seg.nii.gz"), "verdict": "ok"}  # fmt: skip
    page = pair_page(tmp_path / "out", row).read_text()
    assert re.findall(r"data-plane=(\w+)", page) == ["axial", "coronal", "sagittal"]
    assert "label borders" in page
    planes = pair_planes(fixed, fixed[::-1], affine, fixed_seg=seg, moved_seg=seg[::-1])
    from PIL import Image

    sizes = [Image.open(io.BytesIO(p.fixed)).size for p in planes]  # (width, height) in pixels
    assert sizes == [(20, 24), (20, 16), (24, 16)]  # one pixel per voxel of each plane
    assert [round(p.aspect, 3) for p in planes] == [1.2, 1.6, round(32 / 24, 3)]
    layer = np.asarray(Image.open(io.BytesIO(planes[0].layer)).convert("RGBA"))
    assert layer.shape[2] == 4 and 0 < (layer[..., 3] > 0).mean() < 1  # some pixels drawn
    colours = {tuple(c) for c in layer[layer[..., 3] == 255][:, :3]}
    assert colours <= {(255, 230, 0), (0, 220, 255), (60, 230, 60)}  # label borders, opaque


def test_pair_images_are_small_and_close_to_the_lossless_ones() -> None:
    from PIL import Image

    root = data_path("neurite-oasis")  # a real 1 mm brain: what the bytes are about
    image = nib.load(root / "OASIS_OAS1_0001_MR1" / "aligned_norm.nii.gz")
    data = np.asarray(image.dataobj, dtype=np.float32)
    lossy = pair_planes(data, data, image.affine)
    lossless = pair_planes(data, data, image.affine, quality=None)
    assert lossless[0].mime == "image/png" and lossy[0].mime in ("image/webp", "image/jpeg")
    for small, exact in zip(lossy, lossless):
        assert len(small.fixed) < 0.5 * len(exact.fixed)
        a = np.asarray(Image.open(io.BytesIO(small.fixed)).convert("L"), dtype=float)
        b = np.asarray(Image.open(io.BytesIO(exact.fixed)).convert("L"), dtype=float)
        assert np.abs(a - b).mean() < 3.0  # grey levels 0-255: the anatomy is the same
    # three planes of fixed + moved + layer, as the page holds them (base64: 4/3)
    page_bytes = sum(len(p.fixed) + len(p.moved) + len(p.layer) for p in lossy) * 4 / 3
    assert page_bytes < 60_000


def test_a_pair_whose_images_are_gone_gets_a_page_saying_so(batch: dict[str, Path]) -> None:
    out = batch["out"]
    folder = next(p for p in (out / "pairs").iterdir() if (p / "record.json").is_file())
    (folder / "moved.nii.gz").unlink()
    (folder / "report.html").unlink()
    write_report(out)
    assert "No images: " in (folder / "report.html").read_text()


def test_an_interrupted_batch_reports_the_finished_pairs(tmp_path: Path, monkeypatch) -> None:
    import hyperreg.apps.batch as batch_module

    data = tmp_path / "data"
    rows = [{k: p.name for k, p in write_pair(data, f"p{i}").items()} for i in range(3)]
    csv_path = _write_csv(data / "pairs.csv", rows)
    real = batch_module._register_pair
    calls = []

    def stop_at_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(batch_module, "_register_pair", stop_at_the_second)
    args = ["batch", "--model", str(save_tiny_model(tmp_path / "model.pt")), "--pairs"]
    args += [str(csv_path), "--out", str(tmp_path / "out"), "--no-progress", "--report"]
    assert main(args) == 130
    assert [name for _, name in _rows((tmp_path / "out" / "report.html").read_text())] == [
        "p0_moving__to__p0_fixed"
    ]


@needs_chromium
def test_the_report_renders_sorts_and_flickers(batch: dict[str, Path]) -> None:
    out = batch["out"]
    names = "[...document.querySelectorAll('#pairs tbody tr')].map(r => r.dataset.name)"
    with Browser() as browser:
        browser.navigate((out / "report.html").as_uri())
        browser.wait_for("document.body && document.body.dataset.ready === '1'", 30)
        first = browser.evaluate(names)
        assert len(first) == 4 and browser.evaluate("document.body.innerText.length") > 200
        column = browser.evaluate(
            "[...document.querySelectorAll('#pairs th')].findIndex(h => h.textContent === "
            "'Dice after')"
        )
        values = (
            "[...document.querySelectorAll('#pairs tbody tr')].map(r => "
            f"r.cells[{column}].dataset.value)"
        )
        for direction in (1, -1):  # ascending, then descending, empty cells last
            browser.evaluate(f"document.querySelectorAll('#pairs th')[{column}].click()")
            shown = browser.evaluate(values)
            numbers = [float(v) for v in shown if v]
            assert numbers == sorted(numbers, reverse=direction < 0) and shown[-1] == ""
        assert browser.evaluate(names) != first  # the failed pair moved to the end
        link = browser.evaluate("document.querySelector('#pairs a').href")
        browser.navigate(link)
        browser.wait_for("document.body && document.body.dataset.ready === '1'", 30)
        assert browser.evaluate("document.querySelector('img.moved').naturalWidth") > 0
        seen = {browser.evaluate("document.body.dataset.shown")}
        browser.wait_for("document.body.dataset.shown !== '" + seen.pop() + "'", 5)
        browser.evaluate("document.getElementById('showFixed').click()")
        assert browser.evaluate("document.querySelector('img.moved').style.visibility") == "hidden"


def test_missing_and_non_finite_numbers_sort_last_and_an_empty_error_is_a_row(
    tmp_path: Path,
) -> None:
    (tmp_path / "pairs" / "a").mkdir(parents=True)
    (tmp_path / "summary.csv").write_text(
        "index,name,moving,fixed,moved,mean_dice,verdict\n"
        "0,a,m.nii.gz,f.nii.gz,pairs/a/moved.nii.gz,nan,ok\n"
    )
    (tmp_path / "failures.csv").write_text("index,name,moving,fixed,error\n1,b,m2,f2,\n")
    page = write_report(tmp_path).read_text()
    assert [css for css, _ in _rows(page)] == ["failed", "ok"]
    assert "<td class=num data-value=''>nan</td>" in page
    assert "No images: " in (tmp_path / "pairs" / "a" / "report.html").read_text()
