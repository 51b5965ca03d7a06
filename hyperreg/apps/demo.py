"""``hyperreg demo``: register built-in anatomy with the bundled model (or train one), across λ.

Default input: the MNI152 2009a T1 template and its grey/white-matter maps that nilearn's wheel
ships (read with nibabel; nilearn itself is not imported). Training pairs are coronal slices of
the template, each warped by its own random smooth diffeomorphism (a Gaussian-smoothed random
velocity, integrated) with random gamma, bias field and noise. Held-back pairs use slices never
seen in training: the fixed image is the template slice, the moving image a known random warp of
it, so Dice on the tissue labels (1 grey matter, 2 white matter) and the true displacement are
known. With ``data=`` (neurite-oasis layout) the pairs are real subject slices with their label
maps. By default the pairs are registered with the bundled pretrained 2D model, which never saw
the template; with ``steps > 0`` a model is first trained on the demo's training pairs.

Outputs in ``out``: ``model/`` (checkpoint and log, when trained here), ``nifti/`` (fixed,
moving, moved, moved labels and displacement at each λ for the first held-back pair),
``demo_figure.png`` (moved images with the fixed image's edges, checkerboards, label borders and
field magnitudes across λ; Dice and folding against λ),
``results.csv`` and ``results.md``.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hyperreg._checks import resolve_device
from hyperreg._files import atomic_text, write_csv
from hyperreg.config import ModelConfig, TrainConfig
from hyperreg.figures.backend import pyplot, save_figure
from hyperreg.figures.overlays import edge_mask, label_boundaries, overlay_edges
from hyperreg.figures.slices import checkerboard, oriented_slice, show_slice
from hyperreg.geometry.fields import save_displacement
from hyperreg.geometry.intensity import normalize_intensity
from hyperreg.geometry.io import Volume, load_volume, save_volume
from hyperreg.method.metrics import field_summary, mean_registration_dice
from hyperreg.method.model import HyperMorph, load_checkpoint
from hyperreg.method.spatial import integrate_velocity, warp
from hyperreg.pretrained import default_model
from hyperreg.training.data import PairSampler, find_scans
from hyperreg.training.train import train

__all__ = ["DEMO_LAMBDAS", "TemplatePairs", "run_demo"]

logger = logging.getLogger(__name__)

DEMO_LAMBDAS = (0.1, 0.3, 0.5, 0.7, 0.9)
_MNI = "mni_icbm152_{}_tal_nlin_sym_09a_converted.nii.gz"


def _nilearn_data() -> Path:
    spec = importlib.util.find_spec("nilearn")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "hyperreg demo needs the MNI152 template shipped in nilearn's wheel: "
            "pip install nilearn (or pass --data with a neurite-oasis folder)"
        )
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data"


def _slice_affine(affine: np.ndarray, axis: int, index: int) -> np.ndarray:
    """Affine of the 2D slice ``index`` along ``axis``, stored as an (I, J, 1) volume."""
    keep = [a for a in range(3) if a != axis]
    sliced = np.eye(4)
    sliced[:, 0] = affine[:, keep[0]]
    sliced[:, 1] = affine[:, keep[1]]
    sliced[:, 2] = affine[:, axis]
    sliced[:, 3] = affine[:, 3] + index * affine[:, axis]
    return sliced


def random_velocity(
    shape: tuple[int, ...],
    batch: int,
    generator: torch.Generator,
    amplitude: float,
    spacing: int = 12,
) -> Tensor:
    """Smooth random velocity ``(B, 2, *shape)`` in voxels: coarse Gaussian noise, upsampled."""
    coarse = [max(2, s // spacing) for s in shape]
    noise = torch.randn(batch, 2, *coarse, generator=generator) * amplitude
    return F.interpolate(noise, size=shape, mode="bicubic", align_corners=False)


def _augment_intensity(image: Tensor, generator: torch.Generator) -> Tensor:
    batch = image.shape[0]
    gamma = torch.exp(torch.randn(batch, 1, 1, 1, generator=generator) * 0.2)
    bias = torch.exp(random_velocity(image.shape[2:], batch, generator, 0.15, spacing=48)[:, :1])
    noisy = image.clamp_min(0).pow(gamma) * bias
    noisy = noisy + 0.02 * torch.randn(image.shape, generator=generator)
    flat = noisy.flatten(1)
    low, high = flat.min(1).values, flat.max(1).values
    return (noisy - low.view(-1, 1, 1, 1)) / (high - low).view(-1, 1, 1, 1)


class TemplatePairs:
    """Synthetic training and evaluation pairs from coronal slices of the MNI152 template.

    Slices with at least half the maximal grey-matter area are used; every fourth is held back
    for evaluation. Each training image is the slice warped by a random diffeomorphism: a
    Gaussian random velocity of ``amplitude`` voxels on control points ``spacing`` voxels apart,
    interpolated bicubically and integrated by scaling and squaring.
    """

    def __init__(self, amplitude: float = 5.0, spacing: int = 24) -> None:
        root = _nilearn_data()
        t1 = load_volume(root / _MNI.format("t1"))
        gm = load_volume(root / _MNI.format("gm")).data
        wm = load_volume(root / _MNI.format("wm")).data
        self.affine = t1.affine
        self.axis = 1  # RAS: axis 1 runs posterior-anterior, so its slices are coronal
        # slice axis first and contiguous, so cutting a slice is a cheap contiguous copy
        self.image = np.ascontiguousarray(np.moveaxis(normalize_intensity(t1.data), self.axis, 0))
        labels = np.argmax(np.stack([np.full_like(gm, 0.5 * gm.max()), gm, wm]), axis=0)
        self.labels = np.ascontiguousarray(np.moveaxis(labels.astype(np.int32), self.axis, 0))
        area = (gm > 0.5 * gm.max()).sum(axis=(0, 2))
        brain = np.flatnonzero(area >= 0.5 * area.max())
        self.eval_slices = brain[2::4]
        self.train_slices = np.setdiff1d(brain, self.eval_slices)
        self.amplitude = amplitude
        self.spacing = spacing

    def _slices(self, indices: np.ndarray) -> tuple[Tensor, Tensor]:
        images = self.image[indices]
        labels = self.labels[indices]
        return torch.from_numpy(images)[:, None], torch.from_numpy(labels)[:, None].float()

    def _velocity(self, batch: int, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
        return random_velocity(shape, batch, generator, self.amplitude, self.spacing)

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Training pair: two independent random warps of one slice, intensity-augmented."""
        pick = torch.randint(len(self.train_slices), (batch_size,), generator=generator)
        images, _ = self._slices(self.train_slices[pick.numpy()])
        shape = tuple(images.shape[2:])
        moving = warp(images, integrate_velocity(self._velocity(batch_size, shape, generator)))
        fixed = warp(images, integrate_velocity(self._velocity(batch_size, shape, generator)))
        return _augment_intensity(moving, generator), _augment_intensity(fixed, generator)

    def evaluation_pairs(self, count: int, seed: int) -> list[dict[str, object]]:
        """Held-back pairs: fixed = template slice, moving = its known random warp."""
        generator = torch.Generator().manual_seed(seed + 10_000)
        chosen = self.eval_slices[np.linspace(0, len(self.eval_slices) - 1, count).astype(int)]
        pairs = []
        for index in chosen:
            image, labels = self._slices(np.array([index]))
            image = torch.from_numpy(normalize_intensity(image.numpy()))  # per slice, to [0, 1]
            velocity = self._velocity(1, tuple(image.shape[2:]), generator)
            disp = integrate_velocity(velocity)
            moving = warp(image, disp)
            moving_seg = warp(labels, disp, mode="nearest")
            affine = _slice_affine(self.affine, self.axis, int(index))
            pairs.append(
                {
                    "name": f"mni_coronal_{index}",
                    "moving": _augment_intensity(moving, generator),
                    "fixed": image,
                    "moving_seg": moving_seg,
                    "fixed_seg": labels,
                    "affine": affine,
                    # the field that undoes exp(v) is exp(−v): the exact answer to recover
                    "true_disp": integrate_velocity(-velocity, 7),
                }
            )
        return pairs


def _image_tensor(volume: Volume) -> Tensor:
    return torch.from_numpy(normalize_intensity(volume.data))[None, None]


def _label_tensor(path: Path) -> Tensor:
    return torch.from_numpy(load_volume(path, label=True).data)[None, None].float()


def _oasis_pairs(data: str) -> tuple[PairSampler, list[dict[str, object]]]:
    scans = find_scans(data, 2)
    sampler = PairSampler(scans, 2)
    pairs = []
    for folder in sorted({scan.image.parent for scan in scans}):
        others = [s.image.parent for s in scans if s.image.parent != folder]
        for other in others:
            files = [folder / "slice_norm.nii.gz", other / "slice_norm.nii.gz"]
            segs = [folder / "slice_seg24.nii.gz", other / "slice_seg24.nii.gz"]
            if not all(p.is_file() for p in files + segs):
                continue
            moving, fixed = load_volume(files[0]), load_volume(files[1])
            pairs.append(
                {
                    "name": f"{folder.name}_to_{other.name}",
                    "moving": _image_tensor(moving),
                    "fixed": _image_tensor(fixed),
                    "moving_seg": _label_tensor(segs[0]),
                    "fixed_seg": _label_tensor(segs[1]),
                    "affine": fixed.affine,
                    "disk_shape": fixed.disk_shape,
                    "true_disp": None,
                }
            )
    if not pairs:
        raise ValueError(
            f"hyperreg demo: '{data}' has no subject pair with slice_norm.nii.gz and "
            "slice_seg24.nii.gz to evaluate on"
        )
    return sampler, pairs


@torch.no_grad()
def _evaluate(
    model: HyperMorph, pairs: list[dict[str, object]], out: Path
) -> list[dict[str, object]]:
    device = next(model.parameters()).device
    rows: list[dict[str, object]] = []
    nifti = out / "nifti"
    for number, pair in enumerate(pairs):
        moving = pair["moving"].to(device)  # type: ignore[union-attr]
        fixed = pair["fixed"].to(device)  # type: ignore[union-attr]
        fixed_seg = pair["fixed_seg"].numpy()[0, 0].astype(np.int32)  # type: ignore[union-attr]
        moving_seg = pair["moving_seg"].to(device)  # type: ignore[union-attr]
        moving_labels = moving_seg.cpu().numpy()[0, 0].astype(np.int32)
        before = mean_registration_dice(moving_labels, fixed_seg, moving_labels)
        shape = tuple(fixed.shape[2:])
        like = Volume(
            fixed.cpu().numpy()[0, 0],
            np.asarray(pair["affine"]),
            tuple(pair.get("disk_shape", shape + (1,))),  # type: ignore[arg-type]
        )
        if number == 0:
            save_volume(nifti / "fixed.nii.gz", like.data, like)
            save_volume(nifti / "moving.nii.gz", moving.cpu().numpy()[0, 0], like)
            save_volume(nifti / "fixed_seg.nii.gz", fixed_seg, like, label=True)
        for lam in DEMO_LAMBDAS:
            result = model(moving, fixed, lam)
            moved_seg = warp(moving_seg, result.disp, mode="nearest").cpu().numpy()[0, 0]
            summary = field_summary(result.disp)
            row: dict[str, object] = {
                "pair": pair["name"],
                "lambda": lam,
                "dice_before": round(before, 4),
                "dice": round(
                    mean_registration_dice(moved_seg.astype(np.int32), fixed_seg, moving_labels), 4
                ),
                "folding_percent": round(100 * summary["folding_fraction"], 4),
                "log_jacobian_std": round(summary["log_jacobian_std"], 4),
            }
            true_disp = pair["true_disp"]
            if true_disp is not None:
                # end-point error inside the labelled tissue, against the known true field
                tissue = torch.from_numpy(fixed_seg > 0)
                true_norm = true_disp[0].norm(dim=0)  # type: ignore[index]
                error = (result.disp[0].cpu() - true_disp[0]).norm(dim=0)  # type: ignore[index]
                row["field_error_before"] = round(float(true_norm[tissue].mean()), 3)
                row["field_error"] = round(float(error[tissue].mean()), 3)
            rows.append(row)
            if number == 0:
                tag = f"lambda{lam:.1f}"
                save_volume(nifti / f"moved_{tag}.nii.gz", result.moved.cpu().numpy()[0, 0], like)
                save_volume(
                    nifti / f"moved_seg_{tag}.nii.gz", moved_seg.astype(np.int32), like, label=True
                )
                save_displacement(nifti / f"disp_{tag}.nii.gz", result.disp.cpu().numpy()[0], like)
                pair.setdefault("moved", []).append(result.moved.cpu().numpy()[0, 0])  # type: ignore[union-attr]
                pair.setdefault("moved_seg", []).append(moved_seg.astype(np.int32))  # type: ignore[union-attr]
                pair.setdefault("magnitude", []).append(result.disp.norm(dim=1).cpu().numpy()[0])  # type: ignore[union-attr]
    return rows


def _table(rows: list[dict[str, object]]) -> list[dict[str, float]]:
    """Per-λ means over pairs."""
    table = []
    for lam in DEMO_LAMBDAS:
        chosen = [r for r in rows if r["lambda"] == lam]
        entry = {"lambda": lam}
        for key in chosen[0]:
            if key not in ("pair", "lambda"):
                entry[key] = float(np.mean([float(r[key]) for r in chosen]))  # type: ignore[arg-type]
        table.append(entry)
    return table


def _label_borders(ax: object, fixed: np.ndarray, other: np.ndarray) -> None:
    """Label borders on ``ax``: the fixed map's only (yellow), the other's only (cyan), both
    (green); ``fixed`` and ``other`` are oriented 2D label maps."""
    first, second = label_boundaries(fixed), label_boundaries(other)
    overlay_edges(ax, first & ~second, color="yellow")
    overlay_edges(ax, second & ~first, color="cyan")
    overlay_edges(ax, first & second, color="lime")


def _figure(
    pair: dict[str, object], table: list[dict[str, float]], path: Path, pairs: int, labels: str
) -> None:
    """demo_figure.png, three rows for the first pair plus the curves over all pairs:

    1. moving, fixed, and the moved image at each λ with the fixed image's edges in red;
    2. a checkerboard of the moved image (middle λ) and the fixed image, the Dice and folding
       curves, and the displacement magnitude at each λ;
    3. a checkerboard of moving and fixed (before), and the label borders of the fixed map
       (yellow) against the moving map (before) and each moved map (cyan), agreement green.
    """
    plt = pyplot()
    count = len(DEMO_LAMBDAS)
    fig, axes = plt.subplots(3, count + 2, figsize=(2.5 * (count + 2), 8.6), layout="constrained")

    affine = np.asarray(pair["affine"])
    fixed = oriented_slice(pair["fixed"].numpy()[0, 0], affine)  # type: ignore[union-attr]
    moving = oriented_slice(pair["moving"].numpy()[0, 0], affine)  # type: ignore[union-attr]
    fixed_seg = oriented_slice(pair["fixed_seg"].numpy()[0, 0], affine).data  # type: ignore[union-attr]
    moving_seg = oriented_slice(pair["moving_seg"].numpy()[0, 0], affine).data  # type: ignore[union-attr]
    edges = edge_mask(fixed.data)
    grey = dict(cmap="gray", vmin=0.0, vmax=1.0)
    show_slice(axes[0, 0], moving, "moving (input, no registration)", letters=True, **grey)
    show_slice(axes[0, 1], fixed, "fixed", letters=True, **grey)
    vmax = max(float(m.max()) for m in pair["magnitude"])  # type: ignore[union-attr]
    middle = count // 2
    for column, lam in enumerate(DEMO_LAMBDAS, start=2):
        index = column - 2
        moved = oriented_slice(pair["moved"][index], affine)  # type: ignore[index]
        moved_seg = oriented_slice(pair["moved_seg"][index], affine).data  # type: ignore[index]
        magnitude = pair["magnitude"][index]  # type: ignore[index]
        show_slice(axes[0, column], moved, f"moved, λ = {lam}\nred: fixed edges", **grey)
        overlay_edges(axes[0, column], edges)
        shown = show_slice(
            axes[1, column],
            magnitude,
            f"|u|, λ = {lam} (max {magnitude.max():.1f})",
            affine,
            cmap="magma",
            vmin=0,
            vmax=vmax,
        )
        show_slice(
            axes[2, column],
            fixed,
            f"labels, λ = {lam}: fixed yellow,\nmoved cyan, both green",
            **grey,
        )
        _label_borders(axes[2, column], fixed_seg, moved_seg)
        if index == middle:
            board = checkerboard(moved.data, fixed.data)
            show_slice(
                axes[1, 0],
                fixed._replace(data=board),
                f"checkerboard moved\n(λ = {lam}) / fixed",
                **grey,
            )
    fig.colorbar(shown, ax=axes[1, 2:].tolist(), fraction=0.02, pad=0.01, label="|u| (voxels)")
    board = checkerboard(moving.data, fixed.data)
    show_slice(
        axes[2, 0], fixed._replace(data=board), "checkerboard moving / fixed\n(before)", **grey
    )
    show_slice(axes[2, 1], fixed, "labels before: fixed yellow,\nmoving cyan, both green", **grey)
    _label_borders(axes[2, 1], fixed_seg, moving_seg)
    ax = axes[1, 1]
    lams = [t["lambda"] for t in table]
    ax.plot(lams, [t["dice"] for t in table], "o-", label="Dice after")
    ax.axhline(table[0]["dice_before"], color="gray", ls="--", label="no registration")
    low = min(table[0]["dice_before"], *[t["dice"] for t in table])
    high = max(table[0]["dice_before"], *[t["dice"] for t in table])
    ax.set_ylim(low - 0.05 * (high - low) - 0.01, high + 0.25 * (high - low) + 0.01)
    ax.set_xlabel("λ")
    ax.set_ylabel(f"mean Dice ({labels})", fontsize=8)
    twin = ax.twinx()
    folding = [t["folding_percent"] for t in table]
    twin.plot(lams, folding, "s-", color="tab:red", label="folding")
    twin.set_ylim(0, max(0.1, 1.2 * max(folding)))
    twin.set_ylabel("folding (% J ≤ 0)", color="tab:red", fontsize=8)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(f"Dice and folding vs λ,\nmean over {pairs} held-back pairs", fontsize=8)
    fig.suptitle(
        f"{pair['name']}: alignment across λ (all images but the curves: this pair; {fixed.label})",
        fontsize=10,
    )
    save_figure(fig, path)


def run_demo(
    out: str | Path = "hyperreg-demo",
    data: str | None = None,
    steps: int = 0,
    seed: int = 0,
    device: str = "auto",
    eval_pairs: int = 4,
    progress: bool = True,
) -> str:
    """Register held-back pairs at λ ∈ {0.1, 0.3, 0.5, 0.7, 0.9} and write the report.

    With ``steps=0`` (the default) the pairs are registered with the bundled pretrained 2D
    model (:func:`hyperreg.pretrained.default_model`), which never saw them: seconds on a
    CPU. With ``steps > 0`` a new 2D model is trained on the demo data first (the original
    train-then-register demo) and saved in ``out/model/model.pt``.

    Args:
        out: Output folder (created).
        data: Optional neurite-oasis folder; default is the built-in MNI152 template.
        steps: Training steps, or 0 for the bundled model.
        seed: Seed for training and the synthetic pairs.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        eval_pairs: Number of held-back synthetic pairs (template mode).
        progress: Show the training progress bar.

    Returns:
        The Markdown results table (also written to ``out/results.md``).

    Raises:
        FileNotFoundError: If nilearn (template mode) or ``data`` is missing.
        ValueError: If ``data`` holds no evaluable pair.
    """
    out = Path(out)
    if data is None:
        source: object = TemplatePairs()
        pairs = source.evaluation_pairs(eval_pairs, seed)  # type: ignore[attr-defined]
        description = (
            "MNI152 2009a template; held-back coronal slices as fixed images, each moving image a "
            "known random diffeomorphic warp of its slice with gamma, bias-field and noise changes"
        )
        label_names = "grey and white matter labels of either map (a vanished label counts 0)"
    else:
        source, pairs = _oasis_pairs(data)
        description = f"real subject slices from {data}"
        label_names = "slice_seg24 labels of either map (a vanished label counts 0)"
    resolved = resolve_device("run_demo", device)
    if steps == 0:
        bundled = default_model(2)
        model, _ = load_checkpoint(bundled.path, map_location=resolved)
        how = f"the bundled pretrained model {bundled.name} (no training run)"
        model_file = str(bundled.path)
        return _report(out, model, pairs, description, how, model_file, label_names)
    config = TrainConfig(
        data=data or "",
        out=str(out / "model"),
        steps=steps,
        seed=seed,
        device=device,
        checkpoint_every=max(steps, 1),
        model=ModelConfig(ndim=2),
    )
    logger.info(
        "training a 2D HyperMorph for %d steps (about %.0f min on 2 CPU cores), then registering "
        "%d held-back pairs at λ = %s",
        steps,
        max(1, steps * 0.3 / 60),
        len(pairs),
        ", ".join(f"{v:g}" for v in DEMO_LAMBDAS),
    )
    checkpoint = train(config, pairs=source, progress=progress)  # type: ignore[arg-type]
    model, _ = load_checkpoint(checkpoint, map_location=resolved)
    how = f"a 2D model trained here for {steps} steps"
    return _report(out, model, pairs, description, how, "model/model.pt", label_names)


def _report(
    out: Path,
    model: HyperMorph,
    pairs: list[dict[str, object]],
    description: str,
    how: str,
    model_file: str,
    label_names: str,
) -> str:
    """Register the pairs, write results.csv / results.md / demo_figure.png; the report."""
    rows = _evaluate(model, pairs, out)
    table = _table(rows)
    write_csv(out / "results.csv", rows, list(rows[0]))
    _figure(pairs[0], table, out / "demo_figure.png", len(pairs), label_names)
    keys = [k for k in table[0] if k != "lambda"]
    lines = [
        f"HyperMorph demo: {description}; registered with {how}; {len(pairs)} held-back pairs",
        "",
        "| λ | " + " | ".join(keys) + " |",
        "|---" * (len(keys) + 1) + "|",
    ]
    lines += [
        f"| {t['lambda']:.1f} | " + " | ".join(f"{t[k]:.4f}" for k in keys) + " |" for t in table
    ]
    legend = [f"Dice: mean over the {label_names}"]
    if "field_error" in keys:  # only pairs with a known true field (template mode) have it
        legend.append(
            "field_error: mean end-point error (voxels) inside the labelled tissue against the "
            "known true field (before = no registration)"
        )
    legend.append("log_jacobian_std: spread of log J (0 = no local volume change)")
    lines += [
        "",
        "; ".join(legend) + ".",
        "",
        f"outputs in {out}: demo_figure.png, results.md, results.csv, nifti/; model: {model_file}",
    ]
    report = "\n".join(lines)
    atomic_text(out / "results.md", lambda handle: handle.write(report + "\n"))
    return report
