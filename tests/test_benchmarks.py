"""The benchmark entry command: runs the scripts, writes RESULTS.md and plots, reports failures.

The numbers themselves are measured by ``benchmarks/run_all.py``, not tested; these tests check
that it knows every ``bench_*.py`` script at every size, that the one command still works end to
end at the ``smoke`` size (tiny images, 2 training steps) and that a benchmark that cannot run
is reported as such with a non-zero exit code.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from shared_paths import OASIS as DATA

REPO = Path(__file__).resolve().parents[1]
RUN_ALL = REPO / "benchmarks" / "run_all.py"
# the people split bench_accuracy and bench_mip train on (benchmarks/_common.py PEOPLE_SOURCES)
PEOPLE_SOURCES = ("neurite-oasis", "mindboggle-trt20-2d", "multicontrast-2d")


def _run_all(
    tmp_path: Path, *only: str, data: Path = DATA
) -> tuple[subprocess.CompletedProcess, Path]:
    results = tmp_path / "RESULTS.md"
    command = [sys.executable, str(RUN_ALL), "--size", "smoke", "--only", *only]
    command += ["--results", str(results), "--plot-dir", str(tmp_path / "plots")]
    command += ["--work", str(tmp_path / "work"), "--data", str(data)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    return done, results


@pytest.mark.slow  # a training run, subprocesses or benchmark runs: CI's slow step
def test_run_all_reports_a_benchmark_it_cannot_run(tmp_path: Path) -> None:
    # ANTs registers with the model the accuracy benchmark trains; alone it cannot run
    done, results = _run_all(tmp_path, "ants")
    assert done.returncode == 1
    text = results.read_text()
    assert "## Classical anchor: ANTs SyN\n\nNot run:" in text
    assert "- Failed or not run: ants" in text
    assert "python benchmarks/run_all.py --size smoke --only ants" in text


def test_run_all_knows_every_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(RUN_ALL.parent))
    spec = importlib.util.spec_from_file_location("run_all", RUN_ALL)
    run_all = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "run_all", run_all)  # its dataclass looks itself up there
    spec.loader.exec_module(run_all)
    scripts = {path.name for path in RUN_ALL.parent.glob("bench_*.py")}
    assert sorted(bench.script for bench in run_all.SUITE.values()) == sorted(scripts)
    for name, bench in run_all.SUITE.items():
        assert set(run_all.SIZES) <= set(bench.sizes), name
        assert bench.group in run_all.GROUPS and bench.group != "all", name
    suite = [name for name, bench in run_all.SUITE.items() if bench.group == "suite"]
    assert set(run_all.GPU_SPEED) <= set(suite)


@pytest.mark.slow  # runs benchmark scripts: CI's slow step
def test_run_all_reports_missing_data(tmp_path: Path) -> None:
    # a by-hand and a suite benchmark whose shared data is absent: not started, both reported
    missing = tmp_path / "no-data" / "neurite-oasis"
    done, results = _run_all(tmp_path, "hypernet", "amortisation", "sampling", data=missing)
    assert done.returncode == 1
    text = results.read_text()
    for title in (
        "## Compact Δθ head: accuracy, size and step time per rank and lr",
        "## The cost of amortisation: HyperMorph at 1×/2×/4× a fixed-λ model's steps",
        "## Drawing training pairs",
    ):
        assert f"{title}\n\nCannot run: the shared data is missing {missing}" in text
    assert "- Failed or not run: hypernet, amortisation, sampling" in text
    assert "FAILED" not in text


@pytest.mark.slow
def test_run_all_smoke(tmp_path: Path) -> None:
    sources = [DATA.parent / name for name in PEOPLE_SOURCES]
    if not all(path.is_dir() for path in sources):
        pytest.skip(f"shared data not found: needs {', '.join(map(str, sources))}")
    only = ("overhead", "sweep", "batch", "train_step", "accuracy", "mip")
    done, results = _run_all(tmp_path, *only)
    assert done.returncode == 0, done.stderr[-3000:]
    text = results.read_text()
    assert "FAILED" not in text
    for title in (
        "## Hypernetwork overhead at inference",
        "## Batched λ sweep",
        "## Batch inference throughput",
        "## Training step: hypernetwork overhead in time and memory",
        "## Accuracy: one HyperMorph against fixed-λ models",
        "## MIP against the default parametrisation",
    ):
        section = text.split(title, 1)[1].split("\n## ", 1)[0]
        assert "\n|---|" in section, f"no table under {title!r}"
    for plot in ("accuracy_vs_lambda.png", "mip_vs_default.png"):
        path = tmp_path / "plots" / plot
        assert path.read_bytes().startswith(b"\x89PNG")
        assert f"](plots/{plot})" in text
    assert (tmp_path / "work" / "people" / "accuracy.json").is_file()
