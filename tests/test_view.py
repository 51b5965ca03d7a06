"""``hyperreg view`` and ``sweep --html``: the server (token, fixed routes, λ results, save, clean
stop), and both pages in headless Chromium (skipped, saying so, where chromium is absent)."""

from __future__ import annotations

import base64
import gzip
import http.client
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import nibabel as nib
import numpy as np
import pytest
from browser import CHROMIUM_MISSING, Browser, chromium
from lambda_helpers import (
    AFFINE,
    SHAPE,
    save_tiny_model,
    tiny_model,
    write_blob_pair,
    write_pair,
)
from shared_paths import data_path

from hyperreg.apps.register import register_files
from hyperreg.apps.sweep import sweep_files
from hyperreg.apps.view import open_view
from hyperreg.apps.view_server import ViewServer, make_server
from hyperreg.registration.refine import Refinement

ROOT = Path(__file__).resolve().parents[1]
needs_chromium = pytest.mark.skipif(chromium() is None, reason=CHROMIUM_MISSING)


def _oasis_pair() -> dict[str, Path]:
    root = data_path("neurite-oasis")
    first, second = root / "OASIS_OAS1_0001_MR1", root / "OASIS_OAS1_0002_MR1"
    return {
        "moving": first / "slice_norm.nii.gz",
        "fixed": second / "slice_norm.nii.gz",
        "moving_seg": first / "slice_seg24.nii.gz",
        "fixed_seg": second / "slice_seg24.nii.gz",
    }


def _get(server: ViewServer, path: str, method: str = "GET") -> tuple[int, bytes]:
    """One raw request, the path sent byte for byte (no client-side normalisation)."""
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(str(host), int(port), timeout=120)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.fixture
def tiny_server(tmp_path: Path) -> Iterator[ViewServer]:
    """A server over a tiny synthetic pair and the tiny untrained model (no data needed)."""
    files = write_pair(tmp_path, "pair")
    session = open_view(tiny_model(), **files, out=tmp_path / "saved", init="none", grid=[0, 1])
    server = make_server(session)
    server.serve_in_thread()
    yield server
    server.shutdown()
    server.close()


@pytest.fixture(scope="module")
def oasis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ViewServer]:
    """A server over the 2D OASIS slices with the bundled 2D model (skips without the data)."""
    from hyperreg import load_pretrained

    files = _oasis_pair()
    out = tmp_path_factory.mktemp("view_saved")
    session = open_view(load_pretrained(ndim=2), **files, out=out, grid=[0.0, 0.5, 1.0])
    server = make_server(session)
    server.serve_in_thread()
    yield server
    server.shutdown()
    server.close()


def _token(server: ViewServer) -> str:
    return server.token


# ------------------------------------------------------------------------------ security


def test_requests_without_the_token_are_refused(tiny_server: ViewServer) -> None:
    assert urlsplit(tiny_server.url).hostname == "127.0.0.1"
    token = _token(tiny_server)
    for path in ("/", "/static/view.js", "/api/info", "/api/result?lam=0.5", "/?token=wrong"):
        status, body = _get(tiny_server, path)
        assert status == 403, path
        assert b"token" in body
    assert _get(tiny_server, f"/api/save?lam=0.5&token={token[:-1]}", "POST")[0] == 403
    status, body = _get(tiny_server, f"/?token={token}")
    assert status == 200 and b"hyperreg view" in body and b"niivue.umd.js" in body


@pytest.mark.parametrize(
    "path",
    [
        "/../../etc/passwd",
        "/static/../../../../etc/passwd",
        "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/static/..%2f..%2f..%2fetc%2fpasswd",
        "/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "//etc/passwd",
        "/static/view.js/../../../etc/passwd",
        "/static/page.html",
        "/static/NIIVUE_LICENSE",
        "/static/__init__.py",
        "/api/volume?kind=../../etc/passwd&lam=0.5",
    ],
)
def test_paths_outside_the_routes_are_refused(tiny_server: ViewServer, path: str) -> None:
    for with_token in (False, True):
        sep = "&" if "?" in path else "?"
        asked = f"{path}{sep}token={_token(tiny_server)}" if with_token else path
        status, body = _get(tiny_server, asked)
        assert status in (400, 403, 404), (asked, status)
        assert b"root:" not in body and b"import" not in body


def test_the_server_stops_cleanly(tmp_path: Path) -> None:
    files = write_pair(tmp_path, "pair")
    session = open_view(tiny_model(), **files, init="none", grid=[0.0, 0.5, 1.0])
    server = make_server(session)
    thread = server.serve_in_thread()
    session.start_sweep()
    assert _get(server, f"/api/info?token={server.token}")[0] == 200
    server.shutdown()
    server.close()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert session._sweeper is not None and not session._sweeper.is_alive()
    with pytest.raises(OSError):
        _get(server, "/")


# ---------------------------------------------------------------------------- λ endpoints


def test_lambda_endpoint_registers_the_oasis_pair(oasis_server: ViewServer) -> None:
    token = _token(oasis_server)
    status, body = _get(oasis_server, f"/api/result?lam=0.2&token={token}")
    assert status == 200, body
    low = json.loads(body)
    high = json.loads(_get(oasis_server, f"/api/result?lam=0.9&token={token}")[1])
    assert low["lam"] == pytest.approx(0.2, abs=1e-6) and not low["refined"]
    assert 0.0 < low["mean_dice"] < 1.0 and len(low["dice"]) > 10
    assert low["folding_percent"] >= 0.0 and low["ncc"] is not None
    # a smoother field at the larger λ (the point of the slider)
    assert high["log_jacobian_std"] < low["log_jacobian_std"]
    status, body = _get(oasis_server, f"/api/volume?kind=moved&lam=0.2&token={token}")
    assert status == 200
    image = nib.Nifti1Image.from_bytes(body)
    fixed = nib.load(_oasis_pair()["fixed"])
    assert image.shape == fixed.shape and image.get_data_dtype() == np.uint8
    np.testing.assert_allclose(image.affine, fixed.affine, atol=1e-5)
    for kind in ("checker", "diff", "jac", "fold", "contours", "fixed", "moving", "edges"):
        status, body = _get(oasis_server, f"/api/volume?kind={kind}&lam=0.2&token={token}")
        assert status == 200 and nib.Nifti1Image.from_bytes(body).shape == fixed.shape, kind


@pytest.mark.parametrize("lam", ["1.5", "-0.1", "nan", "abc", ""])
def test_bad_lambda_is_a_400_with_a_message(tiny_server: ViewServer, lam: str) -> None:
    status, body = _get(tiny_server, f"/api/result?lam={lam}&token={_token(tiny_server)}")
    assert status == 400
    assert "lam" in json.loads(body)["error"]


def test_unknown_volume_kind_is_a_400(tiny_server: ViewServer) -> None:
    status, body = _get(tiny_server, f"/api/volume?kind=warp&lam=0.5&token={tiny_server.token}")
    assert status == 400 and "kind" in json.loads(body)["error"]


def test_results_are_cached_and_bounded(tmp_path: Path) -> None:
    files = write_pair(tmp_path, "pair")
    session = open_view(tiny_model(), **files, init="none")
    session.cache_size = 3
    first = session.result(0.25)[0]
    assert session.result(0.25)[0] is first  # cached
    for lam in (0.5, 0.75, 1.0):
        session.result(lam)
    assert len(session._cache) == 3 and session.result(0.25)[0] is not first
    # every network-alone registration joins the curves
    assert [p["lam"] for p in session.curves()["points"]] == [0.25, 0.5, 0.75, 1.0]


def test_save_writes_what_register_writes(oasis_server: ViewServer, tmp_path: Path) -> None:
    from hyperreg import load_pretrained

    token = _token(oasis_server)
    status, body = _get(oasis_server, f"/api/save?lam=0.3&token={token}", "POST")
    assert status == 200, body
    saved = [Path(p) for p in json.loads(body)["files"]]
    assert [p.name for p in saved] == [
        "moved_lam0.3.nii.gz",
        "warp_lam0.3.nii.gz",
        "moved_seg_lam0.3.nii.gz",
    ]
    files = _oasis_pair()
    register_files(
        load_pretrained(ndim=2),
        **files,
        lam=0.3,
        moved=tmp_path / "moved.nii.gz",
        warp_out=tmp_path / "warp.nii.gz",
        moved_seg=tmp_path / "moved_seg.nii.gz",
        refine=Refinement(steps=0),  # the page's result is the network's until refined
    )
    for ours, theirs in zip(saved, ("moved", "warp", "moved_seg")):
        mine, reference = nib.load(ours), nib.load(tmp_path / f"{theirs}.nii.gz")
        assert mine.shape == reference.shape and mine.get_data_dtype() == reference.get_data_dtype()
        np.testing.assert_allclose(mine.affine, reference.affine)
        np.testing.assert_allclose(mine.get_fdata(), reference.get_fdata(), atol=1e-5)


def test_refine_runs_the_default_steps_and_is_marked(tmp_path: Path) -> None:
    files = write_pair(tmp_path, "pair")
    session = open_view(tiny_model(), **files, init="none")
    plain = session.result(0.5)[1]
    refined = session.result(0.5, refined=True)[1]
    assert not plain["refined"] and refined["refined"]
    assert session.refinement().steps > 0
    assert "steps" in session.info()["refine"]


# --------------------------------------------------------------------------------- the CLI


def test_cli_view_prints_the_address_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    files = write_pair(tmp_path, "pair")
    model = save_tiny_model(tmp_path / "tiny.pt")
    command = [
        sys.executable, "-m", "hyperreg", "view", "--model", str(model),
        "--moving", str(files["moving"]), "--fixed", str(files["fixed"]),
        "--init", "none", "--no-browser", "--device", "cpu", "--lambdas", "0,1",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        found = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=([\w-]+)", line)
        assert found, line + (process.stderr.read() if process.poll() is not None else "")
        port, token = int(found.group(1)), found.group(2)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request("GET", f"/api/result?lam=0.5&token={token}")
        assert connection.getresponse().status == 200
        connection.close()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "stopped" in out


def test_cli_view_bad_input_is_one_line(tmp_path: Path) -> None:
    from hyperreg.cli.run import main

    files = write_pair(tmp_path, "pair")
    code = main(["view", "--moving", str(tmp_path / "none.nii.gz"), "--fixed",
                 str(files["fixed"]), "--no-browser"])  # fmt: skip
    assert code == 2


# ------------------------------------------------------------------------------ sweep --html


def _embedded(html: str) -> dict:
    start = html.index("window.HYPERREG_EMBEDDED = ") + len("window.HYPERREG_EMBEDDED = ")
    return json.loads(html[start : html.index(";</script>", start)])


def test_sweep_html_is_self_contained(tmp_path: Path) -> None:
    files = write_pair(tmp_path, "pair")
    page = tmp_path / "page.html"
    report = sweep_files(
        tiny_model(), **files, lambdas=[0.0, 0.5, 1.0], out=tmp_path / "out", init="none",
        html=page,
    )  # fmt: skip
    assert page in report.files
    html = page.read_text(encoding="utf-8")
    assert "<script src" not in html and "/api/" not in html.split("window.HYPERREG")[0][-200:]
    data = _embedded(html)
    assert data["info"]["grid"] == pytest.approx([0.0, 0.5, 1.0])
    assert len(data["points"]) == 3 and len(data["volumes"]["moved"]) == 3
    moved = nib.Nifti1Image.from_bytes(
        gzip.decompress(base64.b64decode(data["volumes"]["moved"][1]))
    )
    assert moved.shape == (*SHAPE, 1)
    dice = [p["mean_dice"] for p in data["points"]]
    assert dice == pytest.approx([r.mean_dice for r in report.results])


def test_sweep_html_must_end_in_html(tmp_path: Path) -> None:
    from hyperreg.cli.run import main

    files = write_pair(tmp_path, "pair")
    code = main(["sweep", "--moving", str(files["moving"]), "--fixed", str(files["fixed"]),
                 "--out", str(tmp_path / "o"), "--html", str(tmp_path / "page.txt")])  # fmt: skip
    assert code == 2 and not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------- the pages


def _busy_canvas(png: bytes) -> int:
    """Distinct colours in the viewer's part of a screenshot (left of the side panel)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    viewer = image.crop((0, 40, image.width - 420, image.height))
    return len(np.unique(np.asarray(viewer).reshape(-1, 3), axis=0))


def _move_slider(browser: Browser, value: str) -> None:
    browser.evaluate(
        "(() => { const s = document.getElementById('lam'); s.value = '" + value + "';"
        " s.dispatchEvent(new Event('input')); })()"
    )


def _text(browser: Browser, element: str) -> str:
    return browser.evaluate(f"document.getElementById('{element}').textContent")


@needs_chromium
def test_live_page_renders_and_follows_the_slider(oasis_server: ViewServer) -> None:
    with Browser() as browser:
        browser.navigate(oasis_server.url)
        browser.wait_for("document.body && document.body.dataset.ready === '1'", 90)
        before = (_text(browser, "rLam"), _text(browser, "rDice"), _text(browser, "rSdlogj"))
        assert _busy_canvas(browser.screenshot()) > 50
        _move_slider(browser, "0.85")
        browser.wait_for("document.getElementById('rLam').textContent === '0.850'", 60)
        browser.wait_for("document.body.dataset.busy === '0'", 60)
        after = (_text(browser, "rLam"), _text(browser, "rDice"), _text(browser, "rSdlogj"))
        assert _text(browser, "lamText") == "λ = 0.85"
        assert after[0] != before[0] and after[1] != before[1] and after[2] != before[2]
        assert browser.evaluate("window.hyperregView.shown.lam") == pytest.approx(0.85)
        assert _busy_canvas(browser.screenshot()) > 50


@needs_chromium
def test_sweep_page_renders_from_a_file_and_follows_the_slider(tmp_path: Path) -> None:
    files = write_pair(tmp_path, "pair")
    page = tmp_path / "page.html"
    sweep_files(tiny_model(), **files, lambdas=[0.0, 0.5, 1.0], out=tmp_path / "o", init="none",
                html=page)  # fmt: skip
    with Browser() as browser:
        browser.navigate(page.as_uri())
        browser.wait_for("document.body && document.body.dataset.ready === '1'", 90)
        assert _text(browser, "rLam") == "0.500"
        assert _busy_canvas(browser.screenshot()) > 20
        _move_slider(browser, "2")
        browser.wait_for("document.getElementById('rLam').textContent === '1.000'", 30)
        browser.wait_for("document.body.dataset.busy === '0'", 30)
        assert browser.evaluate("window.hyperregView.shown.lam") == 1.0
        assert _text(browser, "status") == ""  # no error shown


# ------------------------------------------------------------------- volumes for the browser


def test_nifti_bytes_round_trip_with_stride_scales_the_affine() -> None:
    from hyperreg.apps.view_volumes import nifti_bytes

    data = np.arange(6 * 8 * 4, dtype=np.uint8).reshape(6, 8, 4)
    affine = np.diag([1.0, 1.5, 2.0, 1.0])
    affine[:3, 3] = (10, 20, 30)
    raw = nifti_bytes(data, affine, cal=(0, 255), compress=True, stride=(2, 2, 1))
    image = nib.Nifti1Image.from_bytes(gzip.decompress(raw))
    np.testing.assert_array_equal(np.asarray(image.dataobj), data[::2, ::2, :])
    expected = np.diag([2.0, 3.0, 2.0, 1.0])  # x2 along the first two axes, as the stride
    expected[:3, 3] = affine[:3, 3]
    np.testing.assert_allclose(image.affine, expected)
    assert float(image.header["cal_max"]) == 255.0
    flat = nib.Nifti1Image.from_bytes(nifti_bytes(data[:, :, 0], affine))
    assert flat.shape == (6, 8, 1)  # a 2D image is one slice


def test_contours_checker_and_scaling() -> None:
    from hyperreg.apps.view_volumes import checker_mask, label_contours, plane_of, to_uint8

    labels = np.zeros((6, 6), dtype=np.int32)
    labels[2:4, 2:4] = 5
    border = label_contours(labels)
    assert border[2:4, 2:4].all() and border[1, 2] and border[2, 1]  # both sides
    assert not border[0, 0] and not border[5, 5]
    mask = checker_mask((4, 4, 4), squares=2)  # tiles of 2 voxels
    assert mask[0, 0, 0] and not mask[2, 0, 0] and not mask[0, 0, 2] and mask[2, 2, 0]
    assert to_uint8(np.array([0.0, 0.5, 1.0, 2.0]), 0.0, 1.0).tolist() == [0, 128, 255, 255]
    assert not to_uint8(np.ones(3), 1.0, 1.0).any()  # a flat range gives zeros
    assert plane_of(AFFINE) == "coronal"  # its third axis points along world y


def test_one_registration_per_lambda_when_asked_at_once(tmp_path: Path) -> None:
    import threading

    files = write_pair(tmp_path, "pair")
    session = open_view(tiny_model(), **files, init="none")
    calls: list[float] = []
    register = session._register

    def counted(lam: float, refined: bool):
        calls.append(lam)
        time.sleep(0.2)  # long enough for the other requests to queue behind it
        return register(lam, refined)

    session._register = counted  # type: ignore[method-assign]
    threads = [threading.Thread(target=session.result, args=(0.4,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert calls == [0.4]


def test_a_lambda_replaced_while_waiting_is_dropped(tiny_server: ViewServer) -> None:
    import threading

    session = tiny_server.session
    started = threading.Event()
    release = threading.Event()
    register = session._register
    calls: list[float] = []

    def held(lam: float, refined: bool):
        calls.append(lam)
        started.set()
        release.wait(timeout=60)  # the first registration runs until the test lets it end
        return register(lam, refined)

    session._register = held  # type: ignore[method-assign]
    answers: dict[str, int] = {}

    def ask(lam: str) -> None:
        answers[lam] = _get(tiny_server, f"/api/result?lam={lam}&token={tiny_server.token}")[0]

    first = threading.Thread(target=ask, args=("0.1",))
    first.start()
    assert started.wait(timeout=60)
    queued = [threading.Thread(target=ask, args=(lam,)) for lam in ("0.2", "0.3")]
    for ticket, thread in enumerate(queued, start=2):
        thread.start()
        deadline = time.monotonic() + 60
        while session._ticket < ticket and time.monotonic() < deadline:  # asked, in this order
            time.sleep(0.01)
    release.set()
    for thread in (first, *queued):
        thread.join(timeout=60)
    assert answers == {"0.1": 200, "0.2": 409, "0.3": 200}
    assert calls == [0.1, 0.3]  # 0.2 was never registered


# ------------------------------------------------------------------- previews (a quick λ first)


def _two_pass_session(tmp_path: Path, preview: bool | None = True):
    """The bundled 2D model (2 passes) on two blobs it registers in milliseconds."""
    from hyperreg import load_pretrained

    model = load_pretrained(ndim=2)
    assert model.config.passes == 2
    tmp_path.mkdir(parents=True, exist_ok=True)
    files = write_blob_pair(tmp_path)
    return open_view(model, **files, out=tmp_path / "saved", init="none", grid=[0, 1],
                     preview=preview)  # fmt: skip


def test_a_preview_is_one_pass_and_the_full_result_replaces_it(tmp_path: Path) -> None:
    session = _two_pass_session(tmp_path)
    quick = session.page_result(0.3, preview=True)
    assert quick["preview"] and quick["network"] == "1 pass, no flip averaging"
    assert session.curves()["points"] == []  # the curves hold full results only
    moved_quick = session.volume("moved", 0.3, preview=True)
    full = session.page_result(0.3)
    assert not full["preview"] and full["network"] == "2 passes, no flip averaging"
    assert full["log_jacobian_std"] != quick["log_jacobian_std"]
    assert session.volume("moved", 0.3, preview=True) == moved_quick  # the page's preview
    again = session.page_result(0.3, preview=True)  # the full result once it is there
    assert not again["preview"] and again["log_jacobian_std"] == full["log_jacobian_std"]
    assert session.volume("moved", 0.3) != moved_quick
    assert [p["lam"] for p in session.curves()["points"]] == [pytest.approx(0.3)]
    saved = session.save(0.3)  # Save writes the full result, as register does
    result, _ = session.result(0.3)
    warp = nib.load(next(p for p in saved if p.name.startswith("warp_"))).get_fdata()
    assert np.allclose(np.squeeze(warp), np.squeeze(np.moveaxis(result.warp, 0, -1)), atol=1e-4)


def test_previews_only_where_asked_or_in_3d_with_more_than_one_forward(tmp_path: Path) -> None:
    assert not _two_pass_session(tmp_path / "a", preview=None).preview  # 2D: fast enough
    session = _two_pass_session(tmp_path / "b", preview=False)
    assert not session.page_result(0.3, preview=True)["preview"]
    assert session.info()["network"] == "2 passes, no flip averaging"
    assert not session.page_result(0.3, refined=True, preview=True)["preview"]


def test_volumes_are_built_only_when_asked_for(tmp_path: Path) -> None:
    files = write_pair(tmp_path, "pair")
    session = open_view(tiny_model(), **files, init="none")
    session.volume("moved", 0.4)
    entry = session._cache[(0.4, False, False)]
    assert set(entry.volumes) == {"moved"}
    session.volume("fold", 0.4)
    assert set(entry.volumes) == {"moved", "jac", "fold"}  # one Jacobian for both


@needs_chromium
def test_live_page_labels_a_preview_until_the_full_result_comes(tmp_path: Path) -> None:
    import threading

    session = _two_pass_session(tmp_path)
    release = threading.Event()
    register = session._register

    def held(lam: float, refined: bool):
        release.wait(timeout=60)  # the full result waits until the test has seen the preview
        return register(lam, refined)

    session._register = held  # type: ignore[method-assign]
    server = make_server(session)
    server.serve_in_thread()
    try:
        with Browser() as browser:
            browser.navigate(server.url)
            browser.wait_for("document.body && document.body.dataset.ready === '1'", 90)
            browser.wait_for("window.hyperregView.shown.preview", 30)  # ready: the preview
            assert _text(browser, "rKind") == "preview: 1 pass"
            assert browser.evaluate("document.getElementById('preview').hidden") is False
            assert "2 passes" in _text(browser, "preview")
            release.set()
            browser.wait_for("window.hyperregView.shown.preview === false", 60)
            assert _text(browser, "rKind") == "network: 2 passes"
            assert browser.evaluate("document.getElementById('preview').hidden") is True
    finally:
        release.set()
        server.shutdown()
        server.close()


def test_the_sweep_warms_the_first_lambda_and_waits_for_an_idle_page(
    tmp_path: Path, monkeypatch
) -> None:
    import hyperreg.apps.view as view

    session = _two_pass_session(tmp_path)
    session.lam = 0.123  # the page's slider asks for 0.12
    session.grid = [0.5]
    monkeypatch.setattr(view, "SWEEP_IDLE_S", 1000.0)
    session._last_asked = time.monotonic()  # as if the page had just asked for something
    session.start_sweep()
    time.sleep(0.5)
    assert session._cache == {}  # the page is not idle: nothing starts
    session._last_asked = -float("inf")
    session._sweeper.join(timeout=120)
    assert list(session._cache) == [(0.12, False, True), (0.12, False, False), (0.5, False, False)]
    assert [p["lam"] for p in session.curves()["points"]] == pytest.approx([0.12, 0.5])


def test_the_bundled_scripts_are_cacheable_and_the_pair_s_data_is_not(
    tiny_server: ViewServer,
) -> None:
    host, port = tiny_server.server_address[:2]
    token = tiny_server.token

    def cache_control(path: str) -> str:
        connection = http.client.HTTPConnection(str(host), int(port), timeout=120)
        try:
            connection.request("GET", f"{path}{'&' if '?' in path else '?'}token={token}")
            response = connection.getresponse()
            response.read()
            assert response.status == 200, path
            return response.getheader("Cache-Control") or ""
        finally:
            connection.close()

    for name in ("niivue.umd.js", "view.js"):
        assert "max-age=" in cache_control(f"/static/{name}")
    for path in ("/", "/api/info", "/api/volume?kind=fixed"):
        assert cache_control(path) == "no-store"
    page = _get(tiny_server, f"/?token={token}")[1]
    assert page.index(b"view.js") < page.index(b"niivue.umd.js")  # the page script asks first
    assert b"defer" in page


def test_3d_pairs_get_previews_when_the_model_runs_more_than_one_forward(tmp_path: Path) -> None:
    import dataclasses
    from types import SimpleNamespace

    from hyperreg.apps.view import ViewSession

    volume = SimpleNamespace(data=np.zeros((4, 4, 4), dtype=np.float32), ndim=3)
    pair = SimpleNamespace(fixed=volume, aligned=volume)
    model = tiny_model(ndim=3)
    for passes, flips, expected in ((1, False, False), (2, False, True), (1, True, True)):
        model.config = dataclasses.replace(
            model.config, passes=passes, flip_average=flips, orientation="RAS"
        )
        session = ViewSession(model, pair, tmp_path, lam=0.3)  # type: ignore[arg-type]
        assert session.preview is expected, (passes, flips)
