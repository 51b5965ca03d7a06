"""The default 3D ``hyperreg register`` against ANTs SyN: time, Dice and peak memory.

What a user runs: ``hyperreg register`` with its defaults (affine stage, the bundled 3D model's
passes and flip averaging, its refinement, the never-worse verdict, the moved image, moved
label map and warp written as ``.nii.gz``), called in-process through the command line's
``main`` in a fresh subprocess per run, so each run's peak resident memory (``VmHWM`` of
``/proc/self/status``, the high-water mark of the whole process: torch, numpy, SimpleITK) is its
own. ANTs SyN (antspyx ``ants.registration(type_of_transform="SyN")``: its affine + SyN
defaults) runs in the same way with the same thread count
(``ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS``), its label map warped with ``genericLabel``.

Pairs: held-out IXI people at 2 mm with DLMUSE labels (``--pairs N`` of
IXI012->IXI239, IXI239->IXI338, IXI338->IXI452; ``RESULTS_3d_heldout.md``) and, unless
``--no-native``, the native 256³ FreeSurfer pair OAS1_0002 -> OAS1_0001 (``norm.mgz``, aseg).
Dice: hyperreg's one convention (mean over the labels of both inputs, an erased label counting
0, :func:`hyperreg.method.metrics.registration_dice`), for both tools.

Stage times of ours: wall and CPU seconds (``time.process_time``, all threads) of each stage,
exclusive of the stages nested in it (reading, affine stage, network forward passes,
refinement, chain sampling, verdict, writing; the rest is "other"). Also, on the first pair:
``hyperreg sweep`` over 11 λ with ``--refine 0`` (the network alone at each λ, end to end)
against one ``register --refine 0`` (with ``--pairs 0`` that first pair is the 256³ one).

``--threads`` sets torch's, OpenMP's and ITK's thread counts of both tools; hyperreg's affine
stage runs on one ITK thread whatever it says (its results repeat exactly that way).

Usage: ``python benchmarks/bench_register_speed.py [--threads 1|2] [--pairs 3] [--no-native]
[--no-ants] [--write benchmarks/RESULTS_register_speed.md]``; stdout is the Markdown section,
progress on stderr. Timings depend on the machine's load: take them on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_ROOT, log, require_data, table, verdict

IXI_PAIRS = (
    ("IXI012-HH-1211", "IXI239-HH-2296"),
    ("IXI239-HH-2296", "IXI338-HH-1971"),
    ("IXI338-HH-1971", "IXI452-HH-2213"),
)
LAMBDAS_11 = [round(0.1 * i, 1) for i in range(11)]


def pairs(root: Path, count: int, native: bool) -> list[dict]:
    """The pairs: ``count`` IXI 2 mm pairs, then the native 256³ pair when ``native``."""
    ixi = root / "ixi-2mm"
    out = [
        {
            "name": f"{m[:6]} -> {f[:6]} (IXI 2 mm)",
            "moving": str(ixi / f"{m}_T1.nii.gz"),
            "fixed": str(ixi / f"{f}_T1.nii.gz"),
            "moving_seg": str(ixi / f"{m}_DLMUSE.nii.gz"),
            "fixed_seg": str(ixi / f"{f}_DLMUSE.nii.gz"),
        }
        for m, f in IXI_PAIRS[:count]
    ]
    if native:
        fs = root / "oasis1-freesurfer"
        m, f = fs / "OAS1_0002_MR1", fs / "OAS1_0001_MR1"
        out.append(
            {
                "name": "OAS1_0002 -> OAS1_0001 (native 256³)",
                "moving": str(m / "norm.mgz"),
                "fixed": str(f / "norm.mgz"),
                "moving_seg": str(m / "aseg.mgz"),
                "fixed_seg": str(f / "aseg.mgz"),
            }
        )
    return out


# --- the child: one run in a fresh process ---------------------------------------------------


class _Stages:
    """Exclusive wall and CPU seconds per stage: a stage nested in another (a network forward
    inside refinement) counts for itself only."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._stack: list[list[float]] = []  # per open stage: [nested wall, nested cpu]

    def wrap(self, stage: str, fn):  # type: ignore[no-untyped-def]
        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            wall, cpu = time.perf_counter(), time.process_time()
            self._stack.append([0.0, 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                inner = self._stack.pop()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                self.wall[stage] = self.wall.get(stage, 0.0) + wall - inner[0]
                self.cpu[stage] = self.cpu.get(stage, 0.0) + cpu - inner[1]
                if self._stack:
                    self._stack[-1][0] += wall
                    self._stack[-1][1] += cpu

        return timed


def _wrap_everywhere(clock: _Stages, stage: str, module: object, name: str) -> None:
    """Time ``module.name`` under ``stage`` in every hyperreg module that imported it."""
    original = getattr(module, name)
    timed = clock.wrap(stage, original)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("hyperreg") and (
            getattr(mod, name, None) is original
        ):
            setattr(mod, name, timed)


def _instrument(clock: _Stages) -> None:
    import hyperreg.apps.outputs as outputs
    import hyperreg.cli.run  # noqa: F401  (every module the command imports)
    import hyperreg.geometry.affine as affine
    import hyperreg.geometry.io as io
    import hyperreg.registration.chain as chain
    import hyperreg.registration.refine as refine
    from hyperreg.method.model import HyperMorph
    from hyperreg.registration.prepared import PreparedPair

    for stage, module, name in (
        ("read", io, "load_volume"),
        ("affine stage", affine, "register_affine"),
        ("refinement", refine, "refine_flow"),
        ("chain sampling", chain, "sample_volume"),
        ("chain sampling", chain, "composed_displacement"),
        ("write", outputs, "write_outputs"),
    ):
        _wrap_everywhere(clock, stage, module, name)
    HyperMorph.forward = clock.wrap("network", HyperMorph.forward)  # type: ignore[method-assign]
    HyperMorph.predict_flow = clock.wrap("network", HyperMorph.predict_flow)  # type: ignore[method-assign]
    PreparedPair._verdict = clock.wrap("verdict", PreparedPair._verdict)  # type: ignore[method-assign]


def _peak_mib() -> float:
    """This process's peak resident memory in MiB (``VmHWM``; ``ru_maxrss`` elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _ours(job: dict, out: Path) -> dict:
    from hyperreg.cli.run import main
    from hyperreg.geometry.io import load_volume
    from hyperreg.method.metrics import mean_registration_dice

    clock = _Stages()
    _instrument(clock)
    argv = ["register", "--moving", job["moving"], "--fixed", job["fixed"]]
    argv += ["--moving-seg", job["moving_seg"], "--fixed-seg", job["fixed_seg"]]
    argv += ["--moved", str(out / "moved.nii.gz"), "--moved-seg", str(out / "moved_seg.nii.gz")]
    argv += ["--warp", str(out / "warp.nii.gz"), *job.get("extra", [])]
    wall, cpu = time.perf_counter(), time.process_time()
    code = main(argv)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if code != 0:
        raise SystemExit(f"register exited {code}")
    moved = load_volume(out / "moved_seg.nii.gz", label=True).data
    fixed = load_volume(job["fixed_seg"], label=True).data
    moving = load_volume(job["moving_seg"], label=True).data
    dice = mean_registration_dice(moved, fixed, moving)
    return {"wall": wall, "cpu": cpu, "dice": dice, "stages": [clock.wall, clock.cpu]}


def _syn(job: dict, out: Path) -> dict:
    import ants
    import numpy as np

    from hyperreg.geometry.io import load_volume
    from hyperreg.method.metrics import mean_registration_dice

    fixed, moving = ants.image_read(job["fixed"]), ants.image_read(job["moving"])
    wall, cpu = time.perf_counter(), time.process_time()
    reg = ants.registration(fixed, moving, type_of_transform="SyN", outprefix=str(out / "syn_"))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    moved = ants.apply_transforms(
        fixed, ants.image_read(job["moving_seg"]), reg["fwdtransforms"], interpolator="genericLabel"
    )
    fseg = load_volume(job["fixed_seg"], label=True).data
    mseg = load_volume(job["moving_seg"], label=True).data
    dice = mean_registration_dice(np.rint(moved.numpy()).astype(np.int32), fseg, mseg)
    return {"wall": wall, "cpu": cpu, "dice": dice}


def _sweep(job: dict, out: Path) -> dict:
    """``hyperreg sweep`` over 11 λ, network alone (``--refine 0``), end to end as a user runs
    it: reading, the affine stage, the model's passes and flips at each λ, scores, the
    figures and the table."""
    from hyperreg.cli.run import main

    argv = ["sweep", "--moving", job["moving"], "--fixed", job["fixed"]]
    argv += ["--moving-seg", job["moving_seg"], "--fixed-seg", job["fixed_seg"]]
    argv += ["--out", str(out / "sweep"), "--lambdas", "0:1:11", "--refine", "0"]
    wall, cpu = time.perf_counter(), time.process_time()
    code = main(argv)
    if code != 0:
        raise SystemExit(f"sweep exited {code}")
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def child(job: dict) -> dict:
    """Run one job (``job["kind"]``: ours, syn or sweep) here; its numbers and peak memory."""
    import torch

    torch.set_num_threads(job["threads"])
    with tempfile.TemporaryDirectory() as tmp:
        run = {"ours": _ours, "syn": _syn, "sweep": _sweep}[job["kind"]]
        result = run(job, Path(tmp))
    result["peak_mib"] = _peak_mib()
    return result


# --- the parent: one subprocess per run ------------------------------------------------------


def spawn(job: dict) -> dict:
    """``job`` in a fresh Python process with its thread count; the child's result."""
    env = dict(os.environ)
    threads = str(job["threads"])
    env |= {"OMP_NUM_THREADS": threads, "ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS": threads}
    env |= {"MKL_NUM_THREADS": threads}
    with tempfile.TemporaryDirectory() as tmp:
        spec, answer = Path(tmp) / "job.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps(job))
        cmd = [sys.executable, __file__, "--child", str(spec), str(answer)]
        subprocess.run(cmd, env=env, check=True, stdout=sys.stderr)
        return json.loads(answer.read_text())


def _stage_rows(name: str, stages: list[dict], wall: float, cpu: float) -> list[list[str]]:
    walls, cpus = stages
    rows = []
    for stage in sorted(walls, key=lambda s: -cpus[s]):
        rows.append([name, stage, f"{walls[stage]:.2f}", f"{cpus[stage]:.2f}"])
    rest_w, rest_c = wall - sum(walls.values()), cpu - sum(cpus.values())
    rows.append(
        [name, "other (preparation, resampling, Dice, ...)", f"{rest_w:.2f}", f"{rest_c:.2f}"]
    )
    rows.append([name, "**total**", f"{wall:.2f}", f"{cpu:.2f}"])
    return rows


def run(args: argparse.Namespace) -> str:
    """Every run; the Markdown section."""
    require_data(args.data, "ixi-2mm", *(() if args.no_native else ("oasis1-freesurfer",)))
    main_rows, stage_rows = [], []
    chosen = pairs(args.data, args.pairs, not args.no_native)
    for job in chosen:
        log(f"hyperreg register: {job['name']} ...")
        ours = spawn(job | {"kind": "ours", "threads": args.threads})
        stage_rows += _stage_rows(job["name"], ours["stages"], ours["wall"], ours["cpu"])
        syn = None
        if not args.no_ants:
            log(f"ANTs SyN: {job['name']} ...")
            syn = spawn(job | {"kind": "syn", "threads": args.threads})
        target = 0.25 if "256" in job["name"] else 0.5
        ratio = ours["wall"] / syn["wall"] if syn else None
        main_rows.append(
            [
                job["name"],
                f"{ours['wall']:.1f} ({ours['cpu']:.1f})",
                f"{syn['wall']:.1f} ({syn['cpu']:.1f})" if syn else "not run",
                f"{ratio:.2f}" if ratio is not None else "-",
                f"≤ {target}",
                verdict(ratio <= target) if ratio is not None else "-",
                f"{ours['dice']:.4f}",
                f"{syn['dice']:.4f}" if syn else "-",
                f"{ours['peak_mib']:.0f}",
                f"{syn['peak_mib']:.0f}" if syn else "-",
            ]
        )
    first = chosen[0]
    log("11-λ sweep (network alone) and register --refine 0 ...")
    sweep = spawn(first | {"kind": "sweep", "threads": args.threads})
    once = spawn(first | {"kind": "ours", "threads": args.threads, "extra": ["--refine", "0"]})
    net = once["stages"][0].get("network", float("nan"))
    head = [
        "pair",
        "hyperreg s (CPU s)",
        "SyN s (CPU s)",
        "ratio",
        "target",
        "",
        "Dice ours",
        "Dice SyN",
        "peak MiB ours",
        "peak MiB SyN",
    ]
    command = "python benchmarks/bench_register_speed.py " + " ".join(args.argv)
    return "\n".join(
        [
            "## Default `hyperreg register` against ANTs SyN",
            "",
            f"Command: `{command}`; {args.threads} thread(s) (torch, OpenMP, ITK); "
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs. Each run "
            "in its own process; seconds are wall (CPU in brackets), peak memory is the "
            "process's VmHWM. Ratio: wall seconds, ours / SyN.",
            "",
            table(head, main_rows),
            "",
            "Stages of ours (exclusive seconds; wall, CPU):",
            "",
            table(["pair", "stage", "wall s", "CPU s"], stage_rows),
            "",
            f"Network alone, first pair, end to end: `hyperreg sweep --lambdas 0:1:11 "
            f"--refine 0` {sweep['wall']:.2f} s (CPU {sweep['cpu']:.2f}, peak "
            f"{sweep['peak_mib']:.0f} MiB); one `register --refine 0` {once['wall']:.2f} s "
            f"(CPU {once['cpu']:.2f}; its network passes {net:.2f} s, Dice {once['dice']:.4f}); "
            f"ratio {sweep['wall'] / once['wall']:.2f} (target ≤ 3: "
            f"{verdict(sweep['wall'] / once['wall'] <= 3)}).",
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        result = child(json.loads(Path(argv[1]).read_text()))
        Path(argv[2]).write_text(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT, help="shared/data folder")
    parser.add_argument("--threads", type=int, choices=(1, 2), default=1)
    parser.add_argument("--pairs", type=int, choices=(0, 1, 2, 3), default=3, help="IXI pairs")
    parser.add_argument("--no-native", action="store_true", help="skip the 256³ pair")
    parser.add_argument("--no-ants", action="store_true", help="skip ANTs SyN")
    parser.add_argument("--write", type=Path, default=None, help="also write the section here")
    args = parser.parse_args(argv)
    if args.pairs == 0 and args.no_native:
        parser.error("--pairs 0 with --no-native leaves nothing to run")
    args.argv = argv
    text = run(args)
    print(text)
    if args.write is not None:
        args.write.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
