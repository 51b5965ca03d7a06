"""Is the 3D network too small (issue 20, item 3)? Its amortisation gap on people it trained on.

A network that had learnt its training people would leave little for test-time refinement to
gain on their pairs: refinement optimises the very objective the network was trained on, for one
pair at a time (Cremer et al., Inference suboptimality in variational autoencoders, ICML 2018,
call the difference the amortisation gap). So each pair is registered twice at the same λ, the
network alone and the network + ``--refine`` steps, and the objective (loss, lower is better),
the local NCC and Dice of both are compared, on pairs of IXI people the model trained on and on
pairs of the five IXI people it never saw. About the same gap on both sides means the network
underfits (capacity or training length), not that it fails to generalise.

With ``--widths``, the cost side of a wider U-Net: the median time of one training step
(HyperMorph, batch 1, the 3D training grid 96 × 112 × 96, NCC + Grad loss, Adam) for the encoder
and decoder widths scaled by each factor, each in its own subprocess. Run it on a quiet machine.

Pairs: IXI people with a DLMUSE label map, each to the next in name order, in their native spaces
(affine stage first, one ITK thread so the stage repeats exactly); trained: six people spread
over the list of those the model trained on; held out: the five its card lists.

    python benchmarks/bench_3d_fit.py --model hyperreg/pretrained/hypermorph-3d.pt \\
        --out benchmarks/RESULTS_3d_fit.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from _common import DATA_ROOT, log, table

SHAPE = (96, 112, 96)  # the 3D training grid (scripts/train_hypermorph_3d.py)


def ixi_groups(root: Path, holdout: tuple[str, ...]) -> dict[str, list[str]]:
    """Trained and held-out IXI people with a DLMUSE map, in name order."""
    ixi = root / "ixi-2mm"
    people = sorted(
        p.name[: -len("_T1.nii.gz")]
        for p in ixi.glob("*_T1.nii.gz")
        if (ixi / p.name.replace("_T1.nii.gz", "_DLMUSE.nii.gz")).is_file()
    )
    trained = [p for p in people if p not in holdout]
    return {
        "trained": trained[:: max(1, len(people) // 8)][:6],
        "held out": [p for p in people if p in holdout],
    }


def fit_rows(
    model_path: str, root: Path, lam: float, steps: int, most: int = 0
) -> tuple[list, list]:
    """Per pair and per group: Dice (affine, network, refined), loss and NCC before/after."""
    from hyperreg.method.model import load_checkpoint
    from hyperreg.registration.pipeline import load_pair
    from hyperreg.registration.refine import Refinement
    from train_hypermorph_3d import HOLDOUT

    model = load_checkpoint(model_path)[0]
    ixi = root / "ixi-2mm"
    rows, means = [], []
    for group, people in ixi_groups(root, HOLDOUT).items():
        people = people[:most] if most else people  # a cycle of the first ``most`` people
        found = []
        for i, moving in enumerate(people):
            fixed = people[(i + 1) % len(people)]
            log(f"{group}: {moving} -> {fixed}")
            pair = load_pair(
                ixi / f"{moving}_T1.nii.gz",
                ixi / f"{fixed}_T1.nii.gz",
                model=model,
                moving_seg=ixi / f"{moving}_DLMUSE.nii.gz",
                fixed_seg=ixi / f"{fixed}_DLMUSE.nii.gz",
            )
            network = pair.register(model, [lam])[0]
            refined = pair.register(model, [lam], Refinement(steps=steps))[0]
            stats = refined.refinement
            values = [
                pair.dice_affine,
                network.mean_dice,
                refined.mean_dice,
                stats.loss_before,
                stats.loss_after,
                stats.similarity_before,
                stats.similarity_after,
            ]
            found.append(values)
            name = f"{moving[:6]} -> {fixed[:6]}"
            rows.append([group, name, *(f"{v:.4f}" for v in values)])
        mean = np.mean(found, axis=0)
        means.append(
            [group, str(len(found)), *(f"{v:.4f}" for v in mean), f"{mean[3] - mean[4]:.4f}"]
        )
    return rows, means


def _step_worker(factor: float, threads: int) -> dict:
    import resource

    import torch

    from hyperreg.config import ModelConfig, TrainConfig
    from hyperreg.method.model import HyperMorph
    from hyperreg.training.train import hypermorph_loss

    torch.set_num_threads(threads)
    from train_hypermorph_3d import channels

    enc, dec = channels(factor)  # the recipe's --width
    config = TrainConfig(model=ModelConfig(ndim=3, enc_channels=enc, dec_channels=dec))
    torch.manual_seed(0)
    model = HyperMorph(config.model)
    moving, fixed = torch.rand(1, 1, *SHAPE), torch.rand(1, 1, *SHAPE)
    lam = torch.tensor([0.3])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    times = []
    for index in range(8):  # 3 untimed, then 5 timed
        start = time.perf_counter()
        loss, _, _ = hypermorph_loss(model(moving, fixed, lam), fixed, lam, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if index >= 3:
            times.append(time.perf_counter() - start)
    return {
        "enc": enc,
        "dec": dec,
        "seconds": statistics.median(times),
        "parameters": sum(p.numel() for p in model.parameters()),
        "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def width_rows(factors: list[float], threads: int) -> list[list[str]]:
    rows, base = [], None
    for factor in factors:
        command = [sys.executable, __file__, "--worker", str(factor), str(threads)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        base = base or r["seconds"]
        rows.append(
            [
                f"× {factor:g}",
                f"{r['enc']} / {r['dec']}",
                f"{r['parameters'] / 1e6:.2f}",
                f"{r['seconds']:.2f}",
                f"{r['seconds'] / base:.2f}",
                f"{r['peak_gib']:.2f}",
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA_ROOT)
    parser.add_argument("--model", default="hyperreg/pretrained/hypermorph-3d.pt")
    parser.add_argument("--lambda", dest="lam", type=float, default=0.1)
    parser.add_argument("--refine", type=int, default=30)
    parser.add_argument("--widths", type=float, nargs="*", default=[])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (width timing)")
    parser.add_argument("--no-fit", action="store_true", help="the width timing only")
    parser.add_argument("--pairs", type=int, default=0, help="at most N people a group (smoke)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_step_worker(float(args.worker[0]), int(args.worker[1]))))
        return 0
    os.environ["ITK_GLOBAL_DEFAULT_NUMBER_OF_THREADS"] = "1"
    command = "python benchmarks/bench_3d_fit.py " + " ".join(argv or sys.argv[1:])
    text = ["# Is the 3D network too small? Its amortisation gap", "", f"Command: `{command}`", ""]
    if not args.no_fit:
        import torch

        torch.set_num_threads(1)
        rows, means = fit_rows(args.model, args.data, args.lam, args.refine, args.pairs)
        head = ["affine Dice", "network Dice", "refined Dice", "loss network", "loss refined"]
        head += ["NCC network", "NCC refined"]
        text += [
            f"Model `{args.model}` at λ {args.lam:g}; refinement {args.refine} steps (the "
            "library's settings); one torch thread. Dice over the labels of both inputs "
            "(vanished = 0); loss: the model's own objective (lower is better).",
            "",
            table(["people", "pairs", *head, "loss gap"], means),
            "",
            table(["people", "pair", *head], rows),
            "",
        ]
    if args.widths:
        text += [
            f"Training step of wider U-Nets (HyperMorph, batch 1, {SHAPE}, {args.threads} "
            "thread(s), median of 5 after 3):",
            "",
            table(
                ["width", "encoder / decoder", "M parameters", "s / step", "ratio", "peak GiB"],
                width_rows(args.widths, args.threads),
            ),
            "",
        ]
    print("\n".join(text))
    if args.out:
        args.out.write_text("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
