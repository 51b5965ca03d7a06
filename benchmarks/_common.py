"""Helpers shared by the benchmark scripts (not part of the hyperreg package).

Contract every ``bench_*.py`` follows, so that ``run_all.py`` can stitch RESULTS.md together:

* ``main(argv) -> int``; stdout carries only the script's Markdown section body (prose, tables,
  the verdict against DESIGN.md §5); progress and logs go to stderr (:func:`log`).
* Plots are written where ``--plot-dir`` says (PNG, matplotlib's Agg backend).
* Data comes from ``--data`` (default: the neurite-oasis folder of ``../shared/data`` beside the
  repository), never from a hard-coded absolute path.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = Path(os.environ.get("HYPERREG_DATA") or REPO.parent / "shared" / "data")
DEFAULT_DATA = DATA_ROOT / "neurite-oasis"
DEFAULT_PLOTS = REPO / "benchmarks" / "plots"
MOVING = "OASIS_OAS1_0002_MR1"
FIXED = "OASIS_OAS1_0001_MR1"


def log(*parts: object) -> None:
    """Progress message to stderr (stdout is reserved for the Markdown section)."""
    print(*parts, file=sys.stderr, flush=True)


def shape(text: str) -> tuple[int, ...]:
    """``"160x192"`` → ``(160, 192)``."""
    return tuple(int(s) for s in text.split("x"))


def verdict(ok: bool) -> str:
    """The word every table uses against a DESIGN.md §5 target."""
    return "met" if ok else "MISSED"


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; floats are written as given (format them before)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def synchronize(device: object) -> None:
    """Wait for queued CUDA work so wall-clock times are real; no-op on CPU."""
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)


def wall_time(fn: Callable[[], object], device="cpu") -> float:
    """Wall time (s) of one call of ``fn``, with CUDA work synchronised before and after."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def require_data(data: Path, *names: str) -> None:
    """Exit with a one-line message when the shared OASIS files are missing."""
    missing = [str(data / name) for name in names if not (data / name).exists()]
    if missing:
        raise SystemExit(f"benchmark needs the shared OASIS data; missing: {', '.join(missing)}")


def pyplot():
    """matplotlib's pyplot with the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# The people split of the bundled 2D model (its model card): three sources, four validation
# people never trained on (OAS1_0002 and Mindboggle 9/10 moving onto others; S8), test people
# drawn from the seed. Training benchmarks use it at 1.5 mm (144 × 194) to fit a CPU.
PEOPLE_SOURCES = ("neurite-oasis", "mindboggle-trt20-2d", "multicontrast-2d")
PEOPLE_HOLDOUT = ("OASIS_OAS1_0002_MR1", "OASIS-TRT-20-9", "OASIS-TRT-20-10", "S8")
PEOPLE_SPACING = 1.5


def people_config(root: Path, out: Path, **settings):
    """A 2D :class:`hyperreg.config.TrainConfig` on the people split above.

    ``settings`` are further TrainConfig fields (``steps``, ``lr``, ``seed``, ``model`` …).
    Exits with a one-line message when a source is missing under ``root``.
    """
    from hyperreg.config import ModelConfig, TrainConfig

    # resolved (symlinks too): equal settings give equal configs wherever the repository sits
    sources = [root.resolve() / name for name in PEOPLE_SOURCES]
    missing = [str(path) for path in sources if not path.is_dir()]
    if missing:
        raise SystemExit(f"benchmark needs the shared data; missing: {', '.join(missing)}")
    settings.setdefault("model", ModelConfig(ndim=2))
    return TrainConfig(
        data=tuple(str(path) for path in sources),
        out=str(out),
        holdout=PEOPLE_HOLDOUT,
        spacing=PEOPLE_SPACING,
        sim="ncc",
        **settings,
    )


def hyper_config(
    root: Path,
    work: Path,
    parametrization: str,
    lr: float,
    *,
    steps: int,
    batch_size: int,
    seed: int,
    device: str,
    val_every: int = 50,
    val_lambdas: Sequence[float] = (0.1, 0.5, 0.9),
    val_max_pairs: int = 16,
    folder: Path | None = None,
    checkpoint_every: int | None = None,
):
    """The training run of one benchmark arm on the people split, in ``work`` (or ``folder``).

    bench_mip and bench_accuracy build their HyperMorph runs here, so equal settings give equal
    configs and one ``--work`` lets :func:`train_run` train such a run once for both.
    ``checkpoint_every`` (default: only the last step) keeps every checkpoint it writes.
    """
    from hyperreg.config import ModelConfig

    return people_config(
        root,
        folder or work / f"{parametrization}_lr{lr:g}_seed{seed}",
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        device=device,
        val_every=val_every,
        val_lambdas=tuple(val_lambdas),
        val_max_pairs=val_max_pairs,
        checkpoint_every=checkpoint_every or steps,
        keep_checkpoints=1 if checkpoint_every is None else steps // checkpoint_every + 1,
        model=ModelConfig(ndim=2, parametrization=parametrization),
    )


def people_text(split: dict) -> str:
    """One sentence naming who trained and who validated, from a run's ``split.json``."""
    train = ", ".join(split.get("train", [])) or "?"
    val = ", ".join(split.get("val", [])) or "?"
    return (
        f"trained on {len(split.get('train', []))} people ({train}); evaluated on "
        f"{len(split.get('val_pairs', []))} pairs whose moving scan is one of the "
        f"{len(split.get('val', []))} held-out people ({val}), never trained on"
    )


def _one_thread(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def run_jobs(fn: Callable, tasks: Sequence[tuple], jobs: int, threads: int = 1) -> list:
    """``[fn(*task) for task in tasks]``, in ``jobs`` worker processes when ``jobs`` > 1.

    Each worker uses ``threads`` torch threads (two 1-thread trainings on 2 cores outrun one
    2-thread training; two 2-thread ones oversubscribe). ``fn`` must be importable (top level).
    """
    if jobs <= 1:
        return [fn(*task) for task in tasks]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        jobs, mp_context=context, initializer=_one_thread, initargs=(threads,)
    ) as pool:
        futures = [pool.submit(fn, *task) for task in tasks]
        return [future.result() for future in futures]


def train_run(config, reuse: bool) -> tuple[int | None, float]:
    """Train one :func:`hyperreg.training.train.train` run; return ``(diverged_at, seconds)``.

    With ``reuse``, a finished run in ``config.out`` (its ``done.json`` records this config) is
    kept instead, so interrupted benchmarks continue and benchmarks that need the
    same run (bench_mip's MIP arm, bench_accuracy's HyperMorph) share it through one ``--work``.
    A non-finite loss is recorded (``diverged_at``: its step), not raised.
    """
    from hyperreg.config import to_dict
    from hyperreg.training.train import train

    folder = Path(config.out)
    name = folder.name
    done = folder / "done.json"
    if reuse and done.is_file():
        record = json.loads(done.read_text())
        if record.get("config") == to_dict(config):
            log(f"{name}: reusing the finished run")
            return record["diverged_at"], record["seconds"]
    if folder.exists():
        shutil.rmtree(folder)  # no stale checkpoints or logs from an earlier run
    log(f"{name}: training {config.steps} steps")
    start = time.perf_counter()
    diverged_at = None
    try:
        train(config, progress=False)
    except RuntimeError as err:
        if "non-finite" not in str(err):
            raise
        digits = "".join(ch for ch in str(err).rsplit("step", 1)[-1] if ch.isdigit())
        diverged_at = int(digits) if digits else -1
        log(f"{name}: diverged: {err}")
    seconds = time.perf_counter() - start
    record = {"diverged_at": diverged_at, "seconds": seconds, "config": to_dict(config)}
    done.write_text(json.dumps(record, indent=1) + "\n")
    return diverged_at, seconds


def fixed_model_class():
    """The fixed-λ model class (built lazily so ``--help`` does not import torch)."""
    import torch
    from torch import Tensor, nn

    from hyperreg.method.model import HyperMorph

    class FixedLambdaMorph(HyperMorph):
        """HyperMorph's pipeline with ordinary U-Net weights in place of the hypernetwork.

        ``generate_weights`` returns the same trainable weights for every λ, so ``forward``,
        ``register_pair`` and ``evaluate`` run unchanged; λ only enters through the loss the
        model was trained with. Weights are drawn like ``FixedWeightUNet``'s (``UNet.init_std``).
        """

        def __init__(self, config) -> None:
            super().__init__(config)
            del self.hypernet
            stds = self.unet.init_std()
            self.weights = nn.ParameterDict(
                {
                    name.replace(".", "_"): nn.Parameter(torch.randn(shape) * stds[name])
                    for name, shape in self.unet.param_shapes().items()
                }
            )

        def generate_weights(self, lam: Tensor) -> dict[str, Tensor]:
            count = lam.shape[0]
            return {
                name: self.weights[name.replace(".", "_")].expand(count, *shape)
                for name, shape in self.unet.param_shapes().items()
            }

    return FixedLambdaMorph


def train_fixed(config, lam: float):
    """Train a fixed-λ model as ``train`` trains HyperMorph (``split.json`` in ``config.out``).

    Returns ``(diverged_at, seconds, model)`` (``diverged_at``: the step whose loss was
    non-finite, else None).
    """

    import torch

    from hyperreg.training.data import LambdaSampler
    from hyperreg.training.train import hypermorph_loss, prepare_data

    config = config.resolved()  # as train() runs it (model at the training voxel size)
    pairs, _, record = prepare_data(config, load_validation=False)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "split.json").write_text(json.dumps(record, indent=1) + "\n")
    device = torch.device(config.device)
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    model = fixed_model_class()(config.model).to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, fused=True)
    lam_sampler = LambdaSampler(config.lam_endpoint_fraction)
    lam_loss = torch.full((config.batch_size,), lam, device=device)
    start = time.perf_counter()
    for step in range(1, config.steps + 1):
        moving, fixed = pairs.sample(config.batch_size, generator)
        lam_sampler.sample(config.batch_size, generator)  # keeps train()'s pair stream
        moving, fixed = moving.to(device), fixed.to(device)
        output = model(moving, fixed, lam)  # one weight set for the batch: plain convolutions
        loss, _, _ = hypermorph_loss(output, fixed, lam_loss, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if not math.isfinite(float(loss.detach())):
            return step, time.perf_counter() - start, model
    return None, time.perf_counter() - start, model
