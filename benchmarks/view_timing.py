"""Seconds of the λ explorer (``hyperreg view``) in headless Chromium on one real 3D pair.

Serves the bundled 3D model on an IXI 2 mm pair (``shared/data/ixi-2mm``; ``--2d``: the bundled
2D model on two OASIS slices, ``shared/data/neurite-oasis``), opens the page in
headless Chromium (``tests/browser.py``) and measures, from the browser's side:

- page load: navigation to the first image drawn (``data-ready``), and the bytes the page
  fetched at start (Resource Timing);
- a λ change: slider moved to the moment the page shows the new λ's preview, and then the
  model's full result (its passes and flips), each wall seconds and the server process's CPU
  seconds over the same interval (``time.process_time``: every thread of this process, the
  browser excluded).

``--sweep`` starts the background sweep first, as ``hyperreg view`` does, so a λ change
shares the CPU with it. Timings on a shared machine are not quiet-machine figures.

Usage: ``OMP_NUM_THREADS=2 PYTHONPATH=. python benchmarks/view_timing.py [--sweep]
[--threads 2] [--lams 0.2 0.7] [--2d]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from browser import Browser  # noqa: E402

MOVING, FIXED = "IXI162-HH-1548", "IXI174-HH-1571"

_FETCHED = """(() => performance.getEntriesByType('resource').concat(
  performance.getEntriesByType('navigation')).map(e => [e.name.split('?')[0].split('/').pop()
  || 'page', e.transferSize || e.encodedBodySize || 0, e.duration]))()"""


_MARKS = """(() => { const t = performance.getEntriesByType('navigation')[0];
  return {responseEnd: Math.round(t.responseEnd), domInteractive: Math.round(t.domInteractive),
  domContentLoaded: Math.round(t.domContentLoadedEventEnd), load: Math.round(t.loadEventEnd)};
  })()"""


_LAST = """(() => { const all = performance.getEntriesByType('resource');
  const last = (n) => all.filter(e => e.name.includes('/api/' + n + '?')).pop();
  return ['result', 'volume'].map(n => last(n)).filter(Boolean).map(e =>
    [e.name.split('?')[0].split('/').pop(), e.transferSize || e.encodedBodySize || 0,
     Math.round(e.duration)]); })()"""


def _wait(browser: Browser, expression: str, timeout: float = 300.0) -> tuple[float, float]:
    """Wall and process-CPU seconds until ``expression`` holds in the page."""
    wall, cpu = time.perf_counter(), time.process_time()
    browser.wait_for(expression, timeout)
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--lams", type=float, nargs="+", default=[0.2, 0.7])
    parser.add_argument("--2d", dest="two_d", action="store_true")
    args = parser.parse_args()
    import torch

    from hyperreg.apps.models import resolve_model
    from hyperreg.apps.view import open_view
    from hyperreg.apps.view_server import make_server

    torch.set_num_threads(args.threads)
    root = Path(args.data) / ("neurite-oasis" if args.two_d else "ixi-2mm")
    if not root.is_dir():
        raise SystemExit(f"view_timing: no {root}")
    if args.two_d:
        first, second = root / "OASIS_OAS1_0001_MR1", root / "OASIS_OAS1_0002_MR1"
        files = {
            "moving": first / "slice_norm.nii.gz",
            "fixed": second / "slice_norm.nii.gz",
            "moving_seg": first / "slice_seg24.nii.gz",
            "fixed_seg": second / "slice_seg24.nii.gz",
        }
    else:
        files = {
            "moving": root / f"{MOVING}_T1.nii.gz",
            "fixed": root / f"{FIXED}_T1.nii.gz",
            "moving_seg": root / f"{MOVING}_DLMUSE.nii.gz",
            "fixed_seg": root / f"{FIXED}_DLMUSE.nii.gz",
        }
    model = resolve_model(None, image=files["fixed"]).model
    start = time.perf_counter()
    session = open_view(model, **files, out="/tmp/hyperreg_view_timing", lam=0.5)
    print(f"prepare (load + affine): {time.perf_counter() - start:.1f} s wall")
    print(f"full network: passes {model.config.passes}, flips {model.config.flip_average}; "
          f"preview: {session.preview}")  # fmt: skip
    server = make_server(session)
    server.serve_in_thread()
    if args.sweep:
        session.start_sweep()
    try:
        with Browser(timeout=300) as browser:
            browser.call("Performance.enable")
            wall, cpu = time.perf_counter(), time.process_time()
            browser.navigate(server.url)
            browser.wait_for("document.body && document.body.dataset.ready === '1'", 300)
            print(f"page load to first image: {time.perf_counter() - wall:.2f} s wall, "
                  f"server CPU {time.process_time() - cpu:.2f} s")  # fmt: skip
            metrics = browser.call("Performance.getMetrics")["metrics"]
            kept = ("ScriptDuration", "TaskDuration", "LayoutDuration", "RecalcStyleDuration")
            print("browser main thread (s):", {m["name"]: round(m["value"], 2)
                                               for m in metrics if m["name"] in kept})  # fmt: skip
            marks = browser.evaluate(_MARKS)
            print("page marks (ms from navigation):", json.dumps(marks))
            fetched = browser.evaluate(_FETCHED)
            print("fetched at start:", json.dumps(fetched))
            print("bytes at start:", sum(int(f[1]) for f in fetched))
            browser.wait_for("document.body.dataset.busy === '0'", 300)
            for lam in args.lams:
                browser.evaluate(
                    "(() => { const s = document.getElementById('lam'); s.value = '"
                    f"{lam}'; s.dispatchEvent(new Event('input')); }})()"
                )
                shown = f"window.hyperregView.shown && window.hyperregView.shown.lam === {lam}"
                first = _wait(browser, shown)
                kind = browser.evaluate("document.getElementById('rKind').textContent")
                print("  its requests (name, bytes, ms):", json.dumps(browser.evaluate(_LAST)))
                print(f"λ {lam}: first display ({kind}) {first[0]:.2f} s wall, "
                      f"server CPU {first[1]:.2f} s")  # fmt: skip
                if session.preview:
                    full = _wait(browser, shown + " && !window.hyperregView.shown.preview")
                    print(f"λ {lam}: full result shown {full[0]:.2f} s later wall, "
                          f"server CPU {full[1]:.2f} s")  # fmt: skip
                browser.wait_for("document.body.dataset.busy === '0'", 300)
    finally:
        server.shutdown()
        server.close()


if __name__ == "__main__":
    main()
