"""Run every benchmark and write ``benchmarks/RESULTS.md`` and the PNG plots from scratch.

One command, three sizes, two groups:

    python benchmarks/run_all.py --size small     # CPU, about 30 minutes on 2 cores
    python benchmarks/run_all.py --size smoke     # a minute: checks the machinery only
    python benchmarks/run_all.py --size full      # the issue's sizes and steps (hours on CPU)
    python benchmarks/run_all.py --device cuda    # GPU: the speed table at full 3D size only,
                                                  # written to benchmarks/RESULTS_gpu.md
    python benchmarks/run_all.py --group by-hand --size smoke --results /tmp/smoke.md \
        --plot-dir /tmp/smoke-plots               # every other script at smoke size (minutes)

Groups (``--group``): ``suite`` (the default) is the tables of ``RESULTS.md``. ``by-hand`` is
every other ``bench_*.py``: one question each, each with its own results file
(``RESULTS_<question>.md``, see ``benchmarks/README.md``), together hours at ``--size small``
(ANTs on 3D pairs, one model trained per setting), so they stay out of the default run's ~30
minutes. Their ``small`` size is the command their results file records, ``full`` adds the slow
options (ANTs SyN on the 256³ pair, more seeds), ``smoke`` a few pairs or steps (seconds to a
minute and a half each). They write ``RESULTS_by_hand.md`` (``all``: both groups,
``RESULTS_all.md``) unless ``--results`` says otherwise; a maintainer copies a script's section
into its results file. ``--only`` picks scripts of any group, so ``--group all --size smoke``
runs every script.

Each benchmark runs as its own subprocess (``benchmarks/bench_*.py``); its stdout is a Markdown
section body, which this script puts under a heading together with the exact command, its wall
time and the machine's load average before and after (other work on the machine slows timings).
Plots written by a benchmark are linked below its section. A benchmark that fails is reported
as FAILED with the end of its stderr, the others still run, and the exit code is 1; one whose
data or peer is missing (``Bench.needs``, ``Bench.modules``) is not started but reported as
"Cannot run: <reason>", also with exit code 1. The file is written once at the end
(atomically), so an interrupted run leaves the previous RESULTS.md.

Peers are benchmark-only dependencies: ``pip install -e ".[bench]"`` (voxelmorph 0.3.4, antspyx).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from _common import DEFAULT_DATA, DEFAULT_PLOTS, PEOPLE_SOURCES, REPO, log

HERE = Path(__file__).resolve().parent
SIZES = ("smoke", "small", "full")

GROUPS = ("suite", "by-hand", "all")
PEER = 'antspyx (`pip install -e ".[bench]"`)'


@dataclass(frozen=True)
class Bench:
    """One benchmark script and how ``run_all`` runs it.

    ``sizes`` maps each of :data:`SIZES` to the script's arguments ("both": added at every size);
    "{work}", "{model}", "{lam_star}" and "{holdout}" are filled in at run time. ``data`` says
    which folder ``--data`` gets: "oasis" (the neurite-oasis folder, run_all's ``--data``),
    "root" (the shared data folder above it) or "" (none). ``needs`` are paths under the shared
    data folder and ``modules`` peers the script cannot run without: when one is missing the
    script is reported as "Cannot run" instead of being started.
    """

    title: str
    script: str
    sizes: dict[str, list[str]]
    group: str = "suite"  # "suite": run by default, into RESULTS.md; "by-hand": --group by-hand
    data: str = ""
    device: bool = True  # takes --device
    plots: bool = False  # takes --plot-dir
    needs: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()


MODEL_2D = "hyperreg/pretrained/hypermorph-2d.pt"
MODEL_3D = "hyperreg/pretrained/hypermorph-3d.pt"
OASIS_2D = ("neurite-oasis", "mindboggle-trt20-2d", "multicontrast-2d")  # bench_heldout's pairs

SUITE: dict[str, Bench] = {
    "peers": Bench(
        "Inference and training step against voxelmorph and MONAI",
        "bench_peers.py",
        {
            "smoke": ["--size2d", "32x32", "--size3d", "16x16x16", "--repeats", "1"],
            "small": ["--size3d", "160x192x224", "--repeats", "3", "--train-repeats", "10"],
            "full": ["--size3d", "160x192x224", "--repeats", "5", "--train-repeats", "20"],
            "both": ["--memory"],
        },
    ),
    "overhead": Bench(
        "Hypernetwork overhead at inference",
        "bench_overhead.py",
        {
            "smoke": ["--sizes", "32x32", "16x16x16", "--repeats", "1"],
            "small": ["--sizes", "160x192", "160x192x224", "--repeats", "3"],
            "full": ["--sizes", "160x192", "160x192x224", "--repeats", "7"],
        },
    ),
    "train_step": Bench(
        "Training step: hypernetwork overhead in time and memory",
        "bench_train_step.py",
        {
            "smoke": ["--sizes", "32x32:2", "16x16x16:1", "--repeats", "1", "--warmup", "1"],
            "small": ["--sizes", "160x192:4", "80x96x112:1", "--repeats", "3", "--warmup", "4"],
            "full": ["--sizes", "160x192:4", "160x192x224:1", "--repeats", "5", "--warmup", "8"],
        },
    ),
    "train_loop": Bench(
        "Training loop: statistics read every step or once per block",
        "bench_train_loop.py",
        {
            "smoke": ["--sizes", "32x32:2", "16x16x16:1", "--steps", "2", "--repeats", "1"],
            "small": ["--sizes", "160x192:4", "--steps", "20", "--repeats", "3"],
            "full": ["--sizes", "160x192:4", "80x96x112:1", "--steps", "20", "--repeats", "3"],
        },
    ),
    "sweep": Bench(
        "Batched λ sweep",
        "bench_sweep.py",
        {
            "smoke": ["--sizes", "32x32", "--count", "4", "--repeats", "1"],
            "small": ["--sizes", "160x192", "64x64x64", "--repeats", "3"],
            "full": ["--sizes", "160x192", "96x112x128", "--repeats", "5"],
        },
    ),
    "batch": Bench(
        "Batch inference throughput",
        "bench_batch.py",
        {
            "smoke": ["--sizes", "32x32", "--pairs", "2"],
            "small": ["--sizes", "160x192", "96x112x128", "--pairs", "8"],
            "full": ["--sizes", "160x192", "160x192x224", "--pairs", "16"],
        },
    ),
    "accuracy": Bench(
        "Accuracy: one HyperMorph against fixed-λ models",
        "bench_accuracy.py",
        {
            "smoke": ["--steps", "2", "--val-every", "1", "--lrs", "1e-3"],
            "small": ["--steps", "300", "--val-every", "25", "--lrs", "3e-4", "1e-3", "3e-3"],
            "full": ["--steps", "1500", "--val-every", "50"],
            "both": ["--work", "{work}/people", "--reuse", "--jobs", "2"],
        },
        data="root",  # they train on the people split of the whole data folder
        plots=True,
        needs=PEOPLE_SOURCES,
    ),
    "mip": Bench(
        "MIP against the default parametrisation",
        "bench_mip.py",
        {
            "smoke": ["--steps", "2", "--val-every", "1", "--seeds", "0", "--lrs", "1e-3"],
            "small": [
                "--steps",
                "300",
                "--val-every",
                "25",
                "--seeds",
                "0",
                "1",
                "--lrs",
                "3e-4",
                "1e-3",
                "3e-3",
            ],
            "full": ["--steps", "1500", "--val-every", "50", "--seeds", "0", "1", "2"],
            "both": ["--work", "{work}/people", "--reuse", "--jobs", "2"],
        },
        data="root",
        plots=True,
        needs=PEOPLE_SOURCES,
    ),
    "sampling": Bench(
        "Drawing training pairs",
        "bench_sampling.py",
        {"smoke": ["--repeats", "1"], "small": ["--repeats", "5"], "full": ["--repeats", "20"]},
        data="oasis",
        needs=("neurite-oasis",),
    ),
    "ants": Bench(
        "Classical anchor: ANTs SyN",
        "bench_ants.py",
        {
            "smoke": ["--size3d", "none"],
            "small": ["--size3d", "80x96x112", "--steps3d", "150"],
            "full": ["--size3d", "160x192x224", "--steps3d", "1500"],
            "both": [
                "--model",
                "{model}",
                "--lambda",
                "{lam_star}",
                "--holdout-slice",
                "{holdout}",
            ],
        },
        data="oasis",
        needs=("neurite-oasis",),
        modules=("ants",),
    ),
    # By hand: one question each, hours at their recorded sizes; `--group by-hand` (or `all`).
    # small = the command their results file records, full = that with its slow options.
    "hypernet": Bench(
        "Compact Δθ head: accuracy, size and step time per rank and lr",
        "bench_hypernet.py",
        {
            "smoke": ["--steps", "2", "--batch-size", "1", "--ranks", "4", "--eval-lambdas", "0.5"],
            "small": ["--steps", "300", "--ranks", "0", "2", "4", "8", "16", "64", "--lrs", "1e-3"],
            "full": ["--steps", "300", "--ranks", "0", "2", "4", "8", "16", "64", "--lrs", "1e-3"],
            "both": ["--threads", "1"],
        },
        group="by-hand",
        data="oasis",
        device=False,
        needs=("neurite-oasis",),
    ),
    "heldout": Bench(
        "People never seen in training: the bundled 2D model beside ANTs SyN and SyN-CC",
        "bench_heldout.py",
        {
            "smoke": ["--max-pairs", "1", "--lambdas", "0.1", "0.5"],
            "small": [],
            "full": [],
            "both": ["--model", MODEL_2D],
        },
        group="by-hand",
        data="root",
        device=False,
        needs=OASIS_2D,
        modules=("ants",),
    ),
    "refine": Bench(
        "Test-time refinement: Dice gain against Adam steps, beside ANTs SyN-CC",
        "bench_refine.py",
        {
            "smoke": ["--max-pairs", "1", "--steps", "0", "2"],
            "small": [],
            "full": [],
            "both": ["--model", MODEL_2D, "--lr", "0.1"],
        },
        group="by-hand",
        data="root",
        device=False,
        plots=True,
        needs=OASIS_2D,
        modules=("ants",),
    ),
    "native": Bench(
        "Native-space pairs: the affine stage beside ANTs",
        "bench_native.py",
        {
            "smoke": ["--skip-3d"],
            "small": [],
            "full": ["--syn"],
            "both": ["--model", MODEL_2D, "--lambda", "0.1"],
        },
        group="by-hand",
        data="root",
        device=False,
        needs=("oasis1-freesurfer", "multicontrast-2d", "neurite-oasis"),
    ),
    "rotations": Bench(
        "Tilted heads: the affine stage brings rotated copies back",
        "bench_rotations.py",
        {
            "smoke": ["--no-freesurfer", "--ixi", "1", "--tilts=45/0/0", "--repeats", "1"],
            "small": ["--ixi", "0"],
            "full": [],
            "both": ["--threads", "1"],
        },
        group="by-hand",
        data="root",
        device=False,
        needs=("oasis1-freesurfer", "ixi-2mm"),
    ),
    "3d": Bench(
        "3D: the bundled 3D model beside ANTs on the OASIS volume pair",
        "bench_3d.py",
        {
            "smoke": ["--lambdas", "0.1", "--no-ants"],
            "small": ["--refine-steps", "100"],
            "full": ["--refine-steps", "100", "--refine-lambda", "0.1", "--native", "--native-syn"],
            "both": ["--model", MODEL_3D],
        },
        group="by-hand",
        data="root",
        device=False,
        needs=("neurite-oasis", "oasis1-freesurfer"),
    ),
    "3d_heldout": Bench(
        "3D on people the model never saw: hyperreg register beside ANTs",
        "bench_3d_heldout.py",
        {
            "smoke": ["--pairs", "1", "--refine", "2", "--threads", "1", "--no-ants"],
            "small": ["--no-syncc"],  # SyNCC: over 7 minutes a pair (RESULTS_3d_heldout.md)
            "full": [],
            "both": ["--model", MODEL_3D, "--lambda", "0.1"],
        },
        group="by-hand",
        data="root",
        device=False,
        needs=("ixi-2mm", "oasis1-freesurfer"),
    ),
    "trust": Bench(
        "Trust on every pair: never worse than what came in, and a verdict per pair",
        "bench_trust.py",
        {
            "smoke": ["2d", "--margin-pairs", "1", "--margin-lambdas", "0.1"],
            "small": ["2d", "margin", "3d", "--heldout", "2"],
            "full": ["2d", "margin", "3d", "--heldout", "3"],
        },
        group="by-hand",
        data="root",
        device=False,
        needs=("neurite-oasis", "mindboggle-trt20-2d", "ixi-2mm"),
    ),
    "3d_fit": Bench(
        "Is the 3D network too small? Its amortisation gap",
        "bench_3d_fit.py",
        {
            "smoke": ["--pairs", "2", "--refine", "2"],
            "small": [],
            "full": ["--widths", "1", "1.5", "2"],
            "both": ["--model", MODEL_3D],
        },
        group="by-hand",
        data="root",
        device=False,
        needs=("ixi-2mm",),
    ),
    "capacity": Bench(
        "Capacity of the 3D U-Net: validation Dice per training second by width",
        "bench_capacity.py",
        {
            "smoke": ["--widths", "1", "--steps", "2", "--val-every", "2"],
            "small": ["--widths", "1,1.5", "--minutes", "30"],
            "full": ["--widths", "1,1.5,2", "--minutes", "120"],
            "both": ["--out", "{work}/capacity"],
        },
        group="by-hand",
        data="root",
        needs=("ixi-2mm", "oasis1-freesurfer", "lapirn-3d", "misc-3d", "synthseg-labelmaps"),
    ),
    "speed": Bench(
        "Where the seconds go: affine stage, network, coarse-to-fine refinement",
        "bench_speed.py",
        {"smoke": ["--steps", "2"], "small": [], "full": ["--old-refine"]},
        group="by-hand",
        data="root",
        device=False,
        needs=("oasis1-freesurfer", "neurite-oasis"),
    ),
    "register_speed": Bench(
        "The default 3D register against ANTs SyN: time, Dice, peak memory",
        "bench_register_speed.py",
        {"smoke": ["--pairs", "1", "--no-native"], "small": ["--pairs", "1"], "full": []},
        group="by-hand",
        data="root",
        device=False,
        needs=("ixi-2mm", "oasis1-freesurfer"),
        modules=("ants",),
    ),
    "contrast": Bench(
        "Whether two images' contrasts differ: T1 pairs against T2, FLAIR and synthetic T2",
        "bench_contrast.py",
        {"smoke": ["--ixi", "2"], "small": ["--ixi", "4"], "full": []},
        group="by-hand",
        device=False,
        needs=("multicontrast-2d", "ixi-2mm", "neurite-oasis"),
    ),
    "contrast_register": Bench(
        "Default register on other-contrast pairs: aligned T2 -> T1, 2D and 3D synthetic T2",
        "bench_contrast_register.py",
        {
            "smoke": ["aligned", "--work", "{work}"],
            "small": ["aligned", "2d", "--work", "{work}"],
            "full": ["aligned", "2d", "3d", "--work", "{work}"],
        },
        group="by-hand",
        device=False,
        needs=("multicontrast-2d", "ixi-2mm", "neurite-oasis"),
    ),
    "auto_lambda": Bench(
        "λ chosen per pair without labels against global λ* and the per-pair oracle",
        "bench_auto_lambda.py",
        {"smoke": ["--max-pairs", "2"], "small": [], "full": []},
        group="by-hand",
        data="root",
        device=False,
        needs=("mindboggle-trt20-2d", "neurite-oasis"),
    ),
    "amortisation": Bench(
        "The cost of amortisation: HyperMorph at 1×/2×/4× a fixed-λ model's steps",
        "bench_amortisation.py",
        {
            "smoke": [
                "--steps",
                "2",
                "--multiples",
                "1",
                "2",
                "--seeds",
                "0",
                "--lrs",
                "1e-3",
                "--lambdas",
                "0.5",
                "--batch-size",
                "1",
                "--jobs",
                "1",
            ],
            "small": ["--steps", "300", "--seeds", "0", "--lrs", "1e-3", "--jobs", "2"],
            "full": ["--steps", "1500", "--jobs", "2"],  # its defaults: ×1 2 4, 3 seeds, 3 lrs
            "both": ["--work", "{work}/amortisation", "--reuse"],
        },
        group="by-hand",
        data="root",
        plots=True,
        needs=PEOPLE_SOURCES,
    ),
    "heuristics": Bench(
        "Label-map and skull checks on every shared input and copies: wrong verdicts",
        "bench_heuristics.py",
        {"smoke": ["--quick"], "small": [], "full": []},
        group="by-hand",
        data="root",
        device=False,
        needs=("neurite-oasis",),
    ),
}
GPU_SPEED = ("peers", "overhead", "train_step", "train_loop", "sweep", "batch")


def _version(module: str) -> str:
    try:
        imported = __import__(module)
    except Exception as err:  # a missing peer is reported, not fatal
        return f"not installed ({type(err).__name__})"
    return str(getattr(imported, "__version__", "?"))


def _machine(device: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory = f", {pages / 2**30:.0f} GiB RAM"
    except (OSError, ValueError):
        memory = ""
    text = f"{os.cpu_count()} CPU cores ({cpu}){memory}"
    if device.startswith("cuda"):
        import torch

        text += f"; GPU: {torch.cuda.get_device_name(torch.device(device))}"
    else:
        text += "; no GPU used"
    return text


def _versions() -> str:
    import torch

    names = ["hyperreg", "torch", "monai", "voxelmorph", "ants", "SimpleITK", "nibabel", "numpy"]
    parts = [f"{'antspyx' if n == 'ants' else n} {_version(n)}" for n in names]
    return (
        f"Python {platform.python_version()}; "
        + ", ".join(parts)
        + (f"; torch threads {torch.get_num_threads()}")
    )


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def _fill(arguments: list[str], values: dict[str, str]) -> list[str]:
    return [arg.format(**values) for arg in arguments]


def _accuracy_outputs(work: Path) -> dict[str, str | int] | None:
    path = work / "people" / "accuracy.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    # the shared slice pair's coronal slice 109: its moving person (OAS1_0002) is held out
    return {"model": record["model"], "lam_star": f"{record['lam_star']:g}", "holdout": 109}


def cannot_run(bench: Bench, data: Path) -> str:
    """Why ``bench`` cannot run here (missing data or peer), or "" when it can.

    ``data`` is run_all's ``--data`` (the neurite-oasis folder); other needs are looked up in
    the shared data folder above it.
    """
    paths = [data if p == "neurite-oasis" else data.parent / p for p in bench.needs]
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        return f"the shared data is missing {', '.join(missing)}"
    absent = [m for m in bench.modules if importlib.util.find_spec(m) is None]
    if absent:
        names = ", ".join(PEER if m == "ants" else m for m in absent)
        return f"needs {names}, not importable here"
    return ""


def run_one(
    name: str, arguments: list[str], common: list[str], plot_dir: Path, results_dir: Path
) -> tuple[str, bool]:
    """Run one benchmark; return its Markdown section and whether it succeeded."""
    title, script = SUITE[name].title, SUITE[name].script
    command = [sys.executable, str(HERE / script), *arguments, *common]
    shown = " ".join(["python", f"benchmarks/{script}", *map(shlex.quote, arguments + common)])
    before = {p: p.stat().st_mtime for p in plot_dir.glob("*.png")}
    load_start, start = _load(), time.perf_counter()
    log(f"[run_all] {shown}")
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    lines = [f"## {title}", "", f"    {shown}", ""]
    lines.append(f"Wall time {seconds:.0f} s; load average {load_start} before, {_load()} after.")
    lines.append("")
    ok = done.returncode == 0
    if ok:
        lines.append(done.stdout.strip())
    else:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        lines += [f"**FAILED** (exit code {done.returncode}); end of its stderr:", "", "```"]
        lines += [tail, "```"]
        if done.stdout.strip():
            lines += ["", "Output before the failure:", "", done.stdout.strip()]
    for png in sorted(plot_dir.glob("*.png")):
        if before.get(png) != png.stat().st_mtime:
            link = os.path.relpath(png, results_dir)
            lines += ["", f"![{png.stem}]({link})"]
    log(f"[run_all] {name}: {'ok' if ok else 'FAILED'} in {seconds:.0f} s")
    return "\n".join(lines) + "\n", ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="small")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument(
        "--group",
        choices=GROUPS,
        default="suite",
        help="suite: the RESULTS.md tables (default); by-hand: the one-question scripts "
        "(hours at --size small); all: both",
    )
    parser.add_argument(
        "--only", nargs="+", choices=list(SUITE), help="run these benchmarks only (any group)"
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="neurite-oasis folder")
    parser.add_argument("--results", type=Path, help="Markdown file to write")
    parser.add_argument("--plot-dir", type=Path, default=DEFAULT_PLOTS)
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    args = parser.parse_args(argv)

    gpu = args.device.startswith("cuda")
    group = [n for n, b in SUITE.items() if args.group in ("all", b.group)]
    names = args.only or (list(GPU_SPEED) if gpu and args.group == "suite" else group)
    size = "full" if gpu else args.size
    default = {"suite": "RESULTS.md", "by-hand": "RESULTS_by_hand.md", "all": "RESULTS_all.md"}
    results = args.results or HERE / ("RESULTS_gpu.md" if gpu else default[args.group])
    args.plot_dir.mkdir(parents=True, exist_ok=True)
    scratch = None if args.work else tempfile.TemporaryDirectory(prefix="hyperreg-bench-")
    work = args.work or Path(scratch.name)
    work.mkdir(parents=True, exist_ok=True)

    started = datetime.datetime.now(datetime.timezone.utc)
    invocation = " ".join(["python", "benchmarks/run_all.py", *map(shlex.quote, sys.argv[1:])])
    sections, failed = [], []
    for name in names:
        bench = SUITE[name]
        values: dict[str, str | int] = {"work": str(work)}
        if name == "ants":
            found = _accuracy_outputs(work)
            if found is None:
                sections.append(
                    f"## {bench.title}\n\nNot run: it registers with the HyperMorph model and "
                    "λ\\* that the accuracy benchmark trains and picks; run it in the same "
                    "invocation (or pass the same --work).\n"
                )
                failed.append(name)
                continue
            values.update(found)
        reason = cannot_run(bench, args.data)
        if reason:
            sections.append(f"## {bench.title}\n\nCannot run: {reason}.\n")
            log(f"[run_all] {name}: cannot run: {reason}")
            failed.append(name)
            continue
        common = ["--device", args.device] if bench.device else []
        if bench.data:
            common += ["--data", str(args.data if bench.data == "oasis" else args.data.parent)]
        if bench.plots:
            common += ["--plot-dir", str(args.plot_dir)]
        arguments = _fill(bench.sizes[size] + bench.sizes.get("both", []), values)
        section, ok = run_one(name, arguments, common, args.plot_dir, results.parent)
        sections.append(section)
        if not ok:
            failed.append(name)

    finished = datetime.datetime.now(datetime.timezone.utc)
    header = [
        "# Benchmark results" + (" on a GPU" if gpu else ""),
        "",
        "Generated by one command; rerun it to regenerate this file and the plots from scratch:",
        "",
        f"    {invocation}",
        "",
        f"- Run: {started:%Y-%m-%d %H:%M} to {finished:%H:%M} UTC, size `{size}`, "
        f"device `{args.device}`.",
        f"- Machine: {_machine(args.device)}.",
        f"- Versions: {_versions()}.",
        "- Targets are DESIGN.md §5's; every table says *met* or *MISSED* against them. Timings "
        "are wall clock on a machine other jobs may share: the load average before and after "
        "each benchmark is given, and ratios (measured side by side in one run) are what to read.",
    ]
    if not gpu and not (HERE / "RESULTS_gpu.md").exists():
        header.append(
            "- GPU: not measured yet; `bash benchmarks/run_gpu.sh` on a CUDA machine writes "
            "RESULTS_gpu.md."
        )
    others = [p for p in sorted(results.parent.glob("RESULTS*.md")) if p != results]
    if others:
        links = ", ".join(f"[{p.name}]({p.name})" for p in others)
        header.append(f"- Other recorded runs beside this file: {links}.")
    if failed:
        header.append(f"- Failed or not run: {', '.join(failed)} (see their sections).")
    text = "\n".join(header) + "\n\n" + "\n".join(sections)
    temporary = results.with_suffix(".md.tmp")
    temporary.write_text(text)
    temporary.replace(results)
    log(f"[run_all] wrote {results}")
    if scratch is not None:
        scratch.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
