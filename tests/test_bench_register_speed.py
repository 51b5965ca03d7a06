"""benchmarks/bench_register_speed.py's own machinery (not its numbers): the anonymous-memory
peak it reports beside VmHWM, and ``--write`` replacing only the generated section."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_register_speed.py"


@pytest.fixture(scope="module")
def bench():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec = importlib.util.spec_from_file_location("bench_register_speed", BENCH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH.parent))


def _rss_anon_kib() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def test_anon_peak_sees_memory_that_was_freed_again(bench) -> None:  # type: ignore[no-untyped-def]
    if _rss_anon_kib() is None:
        pytest.skip("no RssAnon in /proc/self/status (not Linux)")
    size = 192 * 2**20  # touched pages: resident until freed
    with bench.AnonPeak(period=0.005) as memory:
        start = memory.peak_kib
        block = np.ones(size // 8)
        time.sleep(0.05)  # a few samples while it is held
        del block
    assert _rss_anon_kib() < start + 96 * 1024  # it was handed back
    assert memory.peak_kib >= start + 160 * 1024
    assert memory.peak_mib == memory.peak_kib / 1024


def test_write_replaces_only_the_generated_section(bench, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "RESULTS.md"
    bench.write_section(path, "## Table\n\nfirst\n")
    assert path.read_text() == f"{bench.BEGIN}\n## Table\n\nfirst\n{bench.END}\n"
    prose = "# Title\n\nWho trained the model, by hand.\n\n"
    after = "\nA closing note by hand.\n"
    path.write_text(prose + path.read_text() + after)
    bench.write_section(path, "## Table\n\nsecond\n")
    assert path.read_text() == f"{prose}{bench.BEGIN}\n## Table\n\nsecond\n{bench.END}\n{after}"


def test_write_refuses_a_file_without_markers(bench, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "RESULTS.md"
    path.write_text("# Title\n\nprose only\n")
    with pytest.raises(ValueError, match="must hold one line"):
        bench.write_section(path, "## Table\n")
    assert path.read_text() == "# Title\n\nprose only\n"
    with pytest.raises(SystemExit):  # said before any measurement
        bench.main(["--no-native", "--pairs", "1", "--write", str(path)])


@pytest.mark.parametrize("name", ["RESULTS_register_speed.md", "RESULTS_register_speed_1thread.md"])
def test_the_results_files_have_their_markers(bench, name: str) -> None:  # type: ignore[no-untyped-def]
    bench.check_markers(BENCH.parent / name)
