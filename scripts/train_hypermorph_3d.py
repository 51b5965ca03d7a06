"""Recipe of the bundled 3D model: anatomy-aware HyperMorph on every 3D person in shared/data.

Sources (each person in their own space, storage orientation and voxel size; every scan is
resampled to 2 mm RAS and its foreground centred in a 96 × 112 × 96 training grid):

- ``ixi``: 30 IXI heads at 2 mm with DLMUSE parcellations (29 labelled), one convention;
- ``oasis-fs``: OAS1_0001 / OAS1_0002 FreeSurfer native 256³ ``norm`` + ``aseg``;
- ``lapirn``: LapIRN A / B, skull-stripped, coarse 3-class label maps;
- ``misc``: three unlabelled single T1 scans (two heads, one FreeSurfer ``brain.mgz``);
- synthesis (SynthMorph-style, random contrasts and heads) from the training people's label
  maps and, per convention, SynthSeg 2021 (20, aseg + extra-cerebral), SynthSeg 2020 (20,
  left/right merged) and the GIF map (1).

Held out for validation (never trained on, in any form): OAS1_0002 and five IXI people.
The loss is (1 − λ)·[NCC on real pairs + soft Dice on the pair's labels] + λ·2·Grad-l2.
It continues the bundled 3D model (``--init``) at Adam lr 5e-6 by default: its first 4400 steps
ran at 1e-4, and continuing there did not help while 2e-5 and 5e-6 did (its card, run D); from
step 7858, 2e-5 did not help either (run F).

Usage (CPU, one thread, in the background; re-running resumes)::

    OMP_NUM_THREADS=1 python scripts/train_hypermorph_3d.py --out runs/h3d --device cpu

Capacity (``--width W --init none``): the same recipe from random weights with W times the U-Net
features, at Adam lr 1e-4 unless ``--lr``; ``benchmarks/bench_capacity.py`` runs it per width
and compares validation Dice per training second.

Env: ``HYPERREG_DATA`` the shared data folder (default ``../shared/data``).
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyperreg.config import TrainConfig

HOLDOUT = (
    "OAS1_0002",
    "IXI012-HH-1211",
    "IXI239-HH-2296",
    "IXI338-HH-1971",
    "IXI452-HH-2213",
    "IXI603-HH-2701",
)


def source_rows(data: Path) -> dict[str, list[tuple[Path | str, Path | str, str]]]:
    """The recipe's sources: ``{name: [(image, seg or "", person), ...]}`` under ``data``."""
    ixi = data / "ixi-2mm"
    rows: dict[str, list[tuple[Path | str, Path | str, str]]]
    rows = {name: [] for name in ("ixi", "oasis-fs", "lapirn", "misc")}
    for image in sorted(ixi.glob("*_T1.nii.gz")):
        person = image.name[: -len("_T1.nii.gz")]
        seg = ixi / f"{person}_DLMUSE.nii.gz"
        rows["ixi"].append((image, seg if seg.is_file() else "", person))
    for person in ("OAS1_0001", "OAS1_0002"):
        base = data / "oasis1-freesurfer" / f"{person}_MR1"
        rows["oasis-fs"].append((base / "norm.mgz", base / "aseg.mgz", person))
    for side in ("A", "B"):
        base = data / "lapirn-3d" / f"image_{side}_160x192x144"
        image, seg = Path(f"{base}.nii.gz"), Path(f"{base}_seg.nii.gz")
        rows["lapirn"].append((image, seg, f"lapirn_{side}"))
    misc = data / "misc-3d"
    for name, person in (
        ("studyforrest_sub02_T1w.nii.gz", "studyforrest_sub02"),
        ("pycortex_S1_T1.nii.gz", "pycortex_S1"),
        ("freesurferformats_brain.mgz", "freesurferformats"),
    ):
        rows["misc"].append((misc / name, "", person))
    return rows


def synth_labels(data: Path) -> tuple[Path, ...]:
    """The label maps of synthesis only: two SynthSeg folders and the GIF map."""
    return (
        data / "synthseg-labelmaps" / "2021",
        data / "synthseg-labelmaps" / "2020",
        data / "misc-3d" / "fernando_gif_labels.nii.gz",
    )


def synth_label_files(data: Path) -> list[Path]:
    """The files of :func:`synth_labels` (each folder's NIfTI files, sorted)."""
    found = []
    for source in synth_labels(data):
        found += sorted(source.glob("*.nii*")) if source.is_dir() else [source]
    return found


def write_sources(data: Path, folder: Path) -> list[str]:
    """The CSV sources of the recipe, written into ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    data = data.resolve()  # CSV paths are read relative to the CSV
    paths = []
    for name, items in source_rows(data).items():
        path = folder / f"{name}.csv"
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["image", "seg", "subject"])
            writer.writerows([str(a), str(b), c] for a, b, c in items)
        paths.append(str(path))
    return paths


def channels(width: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The U-Net's encoder and decoder features at ``width`` times the bundled model's (the
    :class:`~hyperreg.config.ModelConfig` defaults), each rounded, at least 1.

    Raises:
        ValueError: If ``width`` is not positive.
    """
    from hyperreg.config import ModelConfig

    if not width > 0:
        raise ValueError(f"--width must be > 0, got {width}")
    base = ModelConfig(ndim=3)

    def scale(features: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(max(1, round(c * width)) for c in features)

    return scale(base.enc_channels), scale(base.dec_channels)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The recipe's command line; ``--lr`` defaults to 5e-6 continuing a model, 1e-4 from scratch.

    Raises:
        SystemExit: (argparse, exit 2) on a bad option, or ``--width`` other than 1 while
            continuing the bundled model (its U-Net has width 1).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/h3d")
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--device", default="cpu")
    # 5e-6: continuing the bundled model at 1e-4 did not help, at 2e-5 and 5e-6 it did (its card,
    # run D); steps 1-4400 of the bundled model ran at 1e-4
    parser.add_argument(
        "--lr", type=float, default=None, help="Adam learning rate (5e-6; 1e-4 with --init none)"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="pairs per step (default 1)")
    parser.add_argument(
        "--init",
        default="",
        help="model to start from (default: bundled 3D; 'none': random weights, from scratch)",
    )
    parser.add_argument(
        "--width",
        type=float,
        default=1.0,
        help="U-Net features times the bundled model's (default 1; other widths need --init none "
        "or a model of that width): the capacity study, benchmarks/bench_capacity.py",
    )
    parser.add_argument(
        "--cascade-every",
        type=int,
        default=0,
        metavar="K",
        help="every K-th step trains the network as the second of two passes on its own moved "
        "image (TrainConfig.cascade_every; default 0, never)",
    )
    parser.add_argument("--val-every", type=int, default=1000, help="validation every N steps")
    parser.add_argument("--checkpoint-every", type=int, default=250)
    parser.add_argument("--no-resume", action="store_true")
    args = parser.parse_args(argv)
    if args.width != 1.0 and not args.init:
        parser.error(f"--width {args.width:g}: the bundled model has width 1; pass --init none")
    try:
        channels(args.width)
    except ValueError as err:
        parser.error(str(err))
    if args.lr is None:
        args.lr = 1e-4 if args.init == "none" else 5e-6
    return args


def recipe_config(args: argparse.Namespace, sources: list[str], data: Path) -> TrainConfig:
    """The run's :class:`~hyperreg.config.TrainConfig` from :func:`parse_args`'s options."""
    from hyperreg.config import ModelConfig, TrainConfig

    init = "" if args.init == "none" else args.init
    if not args.init:
        from importlib.resources import files

        init = str(files("hyperreg") / "pretrained" / "hypermorph-3d.pt")
    enc, dec = channels(args.width)
    return TrainConfig(
        data=tuple(sources),
        out=str(args.out),
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        cascade_every=args.cascade_every,
        sim="ncc",
        label_loss="dice",
        label_weight=1.0,
        max_labels=24,
        label_downsize=2,
        conform=True,
        spacing=2.0,
        shape=(96, 112, 96),
        synth=0.4,
        synth_labels=tuple(str(p) for p in synth_labels(data)),
        holdout=HOLDOUT,
        test_fraction=0.0,
        checkpoint_every=args.checkpoint_every,
        val_every=args.val_every,
        val_lambdas=(0.1, 0.3, 0.6),
        val_max_pairs=6,
        keep_checkpoints=3,
        seed=3,
        device=args.device,
        init=init,
        model=ModelConfig(ndim=3, enc_channels=enc, dec_channels=dec),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    from hyperreg.training.checkpointing import latest_checkpoint
    from hyperreg.training.train import train

    data = Path(os.environ.get("HYPERREG_DATA", "../shared/data"))
    out = Path(args.out)
    config = recipe_config(args, write_sources(data, out.parent / f"{out.name}_sources"), data)
    resume = None
    if not args.no_resume:
        try:
            latest_checkpoint(out)
            resume = str(out)
        except FileNotFoundError:
            resume = None
    from hyperreg.training.checkpointing import TrainingInterrupted

    try:
        train(config, progress=False, resume=resume)
    except TrainingInterrupted as stopped:  # SIGTERM / Ctrl-C: checkpointed, resumable
        print(f"train_hypermorph_3d: {stopped}; run the same command to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
