"""Inference and one training step: hyperreg against voxelmorph 0.3.4 and MONAI VoxelMorph.

Side by side in one process, interleaved, median of ``--repeats`` timed runs after warm-up,
batch 1, untrained weights, random images in [0, 1]:

* hyperreg ``HyperMorph`` (default ``ModelConfig``: encoder 16/32/32/32, decoder 32×5/16/16,
  7 scaling-and-squaring steps at half resolution), weights generated from one λ in every call;
  also with ``int_downsize=1`` (field predicted and integrated at full resolution, as the peers),
  and full-res with voxelmorph's layers (decoder 32×5: no 16/16 full-resolution convolutions);
* voxelmorph 0.3.4 ``VxmPairwise`` (neurite ``BasicUNet``, encoder 16/32/32/32, decoder
  32/32/32/32, 7 integration steps at full resolution);
* MONAI ``monai.networks.nets.VoxelMorph`` (default backbone: encoder 16/32/32, bottom 32,
  decoder 32/32/32 and then 16/16 at full resolution, so its full-resolution convolutions are
  hyperreg's, one level fewer at the coarse end; 7 steps at full resolution; ``half_res=True`` is
  not used: it fails in 2D and scales the field the wrong way round in 3D).

Inference in 2D 160×192 and in 3D ``--size3d``; one training step (forward, backward, Adam) in
2D with the same loss for all three, written with ``hyperreg.method.losses``: (1 − λ)·NCC(window 9)
+ λ·Grad(field), λ = 0.5. Peak memory (``--memory``): one subprocess per model and size runs one
inference; its peak RSS minus that of an import-only subprocess (on CUDA:
``torch.cuda.max_memory_allocated``). Prints a Markdown section (stdout).

    python benchmarks/bench_peers.py --repeats 7 --memory
    python benchmarks/bench_peers.py --size3d 160x192x224 --repeats 3 --memory   # full size

Benchmark-only dependencies: ``pip install -e .[bench]`` (voxelmorph==0.3.4; MONAI is a runtime
dependency already). Peers are only called here, never copied.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence

from _common import log, shape, verdict, wall_time

LAM = 0.5
STEPS = 7
NAMES = ("hyperreg", "hyperreg-fullres", "hyperreg-vxm-layers", "voxelmorph", "monai")
PEERS = ("voxelmorph", "monai")
# like for like: each peer against hyperreg built with that peer's layers, field at full resolution
ALIKE = {"voxelmorph": "hyperreg-vxm-layers", "monai": "hyperreg-fullres"}
VXM_DECODER = (32, 32, 32, 32, 32)  # hyperreg's decoder with voxelmorph's convolutions
DESCRIPTION = (
    "hyperreg `HyperMorph` (default `ModelConfig`: encoder 16/32/32/32, decoder 32×5/16/16, 7 "
    "scaling-and-squaring steps, field at half resolution; weights generated from λ = 0.5 in every "
    "call), the same with `int_downsize=1` (full-resolution field, like the peers), and that with "
    "voxelmorph's layers (decoder 32×5: the 16/16 full-resolution convolutions of the VoxelMorph "
    "paper, which voxelmorph 0.3.4 leaves out, removed) against "
    "voxelmorph 0.3.4 `VxmPairwise` (encoder 16/32/32/32, decoder 32/32/32/32, LeakyReLU, 7 steps) "
    "and MONAI `VoxelMorph` (default backbone: hyperreg's full-resolution convolutions, one level "
    "fewer at the coarse end; 7 steps; `half_res=True` is not used: "
    "it fails in 2D and scales the field the wrong way round in 3D). Side by side in one process, "
    "interleaved, median of {repeats} runs after warm-up, batch 1, untrained, random images, "
    "device {device}. Training step: forward, backward and Adam (lr 1e-4), the same loss for all, "
    "0.5·NCC(window 9) + 0.5·Grad(field), written with `hyperreg.method.losses`. Peak memory: one "
    "subprocess per model runs one inference; its peak minus that of a subprocess that imports "
    "the same libraries and makes the same inputs."
)


def build(name: str, ndim: int):
    """Return ``(module, forward(moving, fixed) -> (moved, field))`` for one model."""
    import torch

    torch.manual_seed(0)
    if name.startswith("hyperreg"):
        from hyperreg.config import ModelConfig
        from hyperreg.method.model import HyperMorph

        layers = {"dec_channels": VXM_DECODER} if name == "hyperreg-vxm-layers" else {}
        downsize = 2 if name == "hyperreg" else 1
        model = HyperMorph(ModelConfig(ndim=ndim, int_steps=STEPS, int_downsize=downsize, **layers))

        def forward(moving, fixed):
            out = model(moving, fixed, LAM)
            return out.moved, out.velocity if out.velocity is not None else out.disp

        return model, forward
    if name == "voxelmorph":
        import voxelmorph as vxm

        model = vxm.nn.models.VxmPairwise(
            ndim=ndim,
            source_channels=1,
            target_channels=1,
            nb_features=[[16, 32, 32, 32], [32, 32, 32, 32]],
            activations=torch.nn.LeakyReLU,
            integration_steps=STEPS,
        )

        def forward(moving, fixed):
            _disp, moved = model(moving, fixed, return_warped_source=True)
            return moved, model.velocity

        return model, forward
    if name == "monai":
        from monai.networks.nets import VoxelMorph

        model = VoxelMorph(spatial_dims=ndim, integration_steps=STEPS, half_res=False)

        def forward(moving, fixed):
            moved, ddf = model(moving, fixed)
            return moved, ddf

        return model, forward
    raise ValueError(name)


def _images(dims: Sequence[int], device):
    import torch

    gen = torch.Generator().manual_seed(1)
    images = torch.rand(1, 1, *dims, generator=gen), torch.rand(1, 1, *dims, generator=gen)
    return tuple(image.to(device) for image in images)


def _median_interleaved(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int, device
) -> dict[str, float]:
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(wall_time(fn, device))
    return {name: statistics.median(t) for name, t in times.items()}


def _try_build(names, ndim, device):
    models, errors = {}, {}
    for name in names:
        try:
            module, forward = build(name, ndim)
            models[name] = (module.to(device), forward)
        except Exception as err:  # a peer that cannot be imported or built is reported
            errors[name] = f"{type(err).__name__}: {err}"
    return models, errors


def bench_inference(dims, repeats, warmup, device):
    import torch

    moving, fixed = _images(dims, device)
    models, errors = _try_build(NAMES, len(dims), device)
    fns = {}
    for name, (module, forward) in models.items():
        module.eval()
        try:
            with torch.no_grad():
                forward(moving, fixed)
        except Exception as err:
            errors[name] = f"{type(err).__name__}: {err}"
            continue
        fns[name] = lambda f=forward: f(moving, fixed)
    with torch.no_grad():
        times = _median_interleaved(fns, repeats, warmup, device)
    counts = {n: sum(p.numel() for p in m.parameters()) for n, (m, _) in models.items()}
    if "hyperreg" in models:
        import math

        unet = models["hyperreg"][0].unet
        counts["hyperreg U-Net (generated)"] = sum(
            math.prod(s) for s in unet.param_shapes().values()
        )
    return times, errors, counts


def bench_train_step(dims, repeats, warmup, device):
    import torch

    from hyperreg.method.losses import gradient_loss, ncc_loss

    moving, fixed = _images(dims, device)
    models, errors = _try_build(NAMES, len(dims), device)
    fns = {}
    for name, (module, forward) in models.items():
        module.train()
        opt = torch.optim.Adam(module.parameters(), lr=1e-4)

        def step(forward=forward, opt=opt):
            opt.zero_grad(set_to_none=True)
            moved, field = forward(moving, fixed)
            loss = (1 - LAM) * ncc_loss(moved, fixed, window=9) + LAM * gradient_loss(field)
            loss.backward()
            opt.step()

        try:
            step()
        except Exception as err:
            errors[name] = f"{type(err).__name__}: {err}"
            continue
        fns[name] = step
    return _median_interleaved(fns, repeats, warmup, device), errors


def child(name: str, size: str, device_name: str) -> int:
    """Subprocess for peak memory: build (unless ``name == 'baseline'``), one inference."""
    import torch

    device = torch.device(device_name)
    dims = shape(size)
    moving, fixed = _images(dims, device)
    import hyperreg.method.model  # noqa: F401  (every child imports the same libraries)
    import monai.networks.nets  # noqa: F401

    try:
        import voxelmorph  # noqa: F401
    except Exception:
        pass
    if name != "baseline":
        module, forward = build(name, len(dims))
        module.to(device).eval()
        with torch.no_grad():
            forward(moving, fixed)
    if device.type == "cuda":
        peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"peak_mib": peak_mib}))
    return 0


def peak_memory(size: str, device: str) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    peak = {}
    for name in ("baseline", *NAMES):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", name, size, device],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            out[name] = "failed"
            continue
        peak[name] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_mib"]
    for name in NAMES:
        if name in peak and "baseline" in peak:
            out[name] = peak[name] - peak["baseline"]
    return out


def _row(label, times, errors, extra=None, target=True):
    cells = []
    for name in NAMES:
        if name in times:
            cell = f"{times[name]:.4f}"
            if extra and isinstance(extra.get(name), float):
                cell += f", {extra[name]:.0f} MiB"
            cells.append(cell)
        else:
            cells.append(f"failed ({errors.get(name, 'not run')[:60]})")
    peers = [times[n] for n in PEERS if n in times]
    for name in ("hyperreg", "hyperreg-fullres"):
        if name in times and peers:
            ratio = times[name] / min(peers)
            judged = f" ({verdict(ratio <= 1.0)})" if target and name == "hyperreg" else ""
            cells.append(f"{ratio:.2f}{judged}")
        else:
            cells.append("n/a")
    measured = [(peer, ours) for peer, ours in ALIKE.items() if peer in times and ours in times]
    alike = {peer: times[ours] / times[peer] for peer, ours in measured}
    if len(alike) == len(ALIKE):
        worst = max(alike.values())
        judged = f" ({verdict(worst <= 1.0)})" if target else ""
        parts = ", ".join(f"{alike[peer]:.2f} vs {peer}" for peer in ALIKE)
        cells.append(f"{parts}{judged}")
    else:
        cells.append("n/a")
    return f"| {label} | " + " | ".join(cells) + " |"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size2d", default="160x192")
    parser.add_argument("--size3d", default="80x96x112", help="full size: 160x192x224")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--train-repeats", type=int, default=5)
    parser.add_argument("--memory", action="store_true", help="peak RSS per model (subprocesses)")
    parser.add_argument("--no-train", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)

    # Memory first: a child started by fork/exec inherits the parent's peak RSS (Linux keeps
    # ru_maxrss across execve), so the parent must still be small when the children run.
    sizes = (args.size2d, args.size3d)
    mem = {size: peak_memory(size, args.device) for size in sizes} if args.memory else {}
    import torch

    device = torch.device(args.device)
    print(DESCRIPTION.format(repeats=args.repeats, device=device))
    print()
    header = "| {} | hyperreg (s) | hyperreg, full-res field (s) | hyperreg, full-res, "
    header += "voxelmorph's layers (s) | voxelmorph `VxmPairwise` (s) | MONAI `VoxelMorph` (s) | "
    header += "hyperreg / faster peer (target ≤ 1.0) | full-res hyperreg / faster peer | "
    header += "like for like: full-res hyperreg with each peer's layers / that peer "
    header += "(target ≤ 1.0) |"
    rule = "|---" * 9 + "|"
    print(header.format("inference, batch 1"))
    print(rule)
    params = {}
    for size in sizes:
        log(f"peers inference {size} ...")
        times, errors, params[size] = bench_inference(
            shape(size), args.repeats, args.warmup, device
        )
        print(_row(size, times, errors, mem.get(size)), flush=True)
    if not args.no_train:
        print()
        print(
            header.format("training step, batch 1").replace(
                "(target ≤ 1.0)", "(no target against peers)"
            )
        )
        print(rule)
        log(f"peers training step {args.size2d} ...")
        times, errors = bench_train_step(
            shape(args.size2d), args.train_repeats, args.warmup, device
        )
        print(_row(args.size2d, times, errors, target=False), flush=True)
    print()
    for size, counts in params.items():
        print(f"Parameters at {size}: " + ", ".join(f"{n} {c:,}" for n, c in counts.items()) + ".")
    print(
        "\nTargets: inference ≤ 1.0 × the faster peer (DESIGN.md §5), and like for like ≤ 1.0 "
        "(issue 11): the peers predict and integrate the field at full resolution (hyperreg's "
        "default does it at half resolution, as HyperMorph and VoxelMorph's papers do), and each "
        "peer is set against hyperreg built with its layers: MONAI's full-resolution convolutions "
        "are hyperreg's (16 → 32 → 16 → 16 → field; it has one level fewer at the coarse end), "
        "voxelmorph 0.3.4's decoder lacks the two 16-channel full-resolution convolutions. The "
        "*full-res hyperreg / faster peer* column keeps hyperreg's own layers, for reference."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
