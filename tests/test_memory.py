"""Peak memory of a registration: what is held and what is sampled when.

The peak itself (a native 256³ register, the process's ``VmHWM``) is measured by
benchmarks/bench_register_speed.py, not here: it counts shared-library pages, which differ by
more than 100 MiB between environments (RESULTS_register_speed.md). These tests pin what keeps
it down: each full-size output of a
chained pair sampled once and the label map and composed field only after the verdict kept
the registration, label maps held in their smallest integer type, Dice and the finiteness
check counted in blocks (same counts in any memory order), freed heap handed back.
"""

from __future__ import annotations

import platform
import sys

import numpy as np
import pytest

import hyperreg.registration.prepared as prepared_module
import hyperreg.registration.transform_chain as chain_module
from hyperreg.geometry import io
from hyperreg.geometry.io import Volume, compact_labels
from hyperreg.method import metrics
from hyperreg.registration.memory import release_freed_memory
from hyperreg.registration.verdict import Verdict
from shared_paths import OASIS

REAL = [OASIS / f"OASIS_OAS1_000{i}_MR1" for i in (2, 1)]  # moving, fixed
needs_oasis = pytest.mark.skipif(
    not all((d / "slice_norm.nii.gz").is_file() for d in REAL),
    reason=f"OASIS 2D slices not found under {OASIS} (HYPERREG_DATA)",
)


def test_release_freed_memory_runs_where_glibc_has_malloc_trim() -> None:
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert release_freed_memory() is glibc


def _naive_dice(a: np.ndarray, b: np.ndarray, labels: list[int]) -> dict[int, float]:
    out = {}
    for label in labels:
        in_a, in_b = a == label, b == label
        total = int(in_a.sum()) + int(in_b.sum())
        out[label] = 0.0 if total == 0 else 2.0 * int((in_a & in_b).sum()) / total
    return out


@pytest.mark.parametrize("orders", [("C", "C"), ("F", "F"), ("C", "F"), ("F", "C")])
@pytest.mark.parametrize("shape", [(9, 7, 5), (11, 6), (23,)])
def test_dice_counted_in_blocks_equals_per_label_counts(
    monkeypatch: pytest.MonkeyPatch, orders: tuple[str, str], shape: tuple[int, ...]
) -> None:
    """Blocks of 7 voxels (many per map, a partial last one), maps in either memory order."""
    monkeypatch.setattr(metrics, "_COUNT_CHUNK", 7)
    rng = np.random.default_rng(3)
    a = rng.integers(0, 6, shape).astype(np.int32)
    b = np.where(rng.random(shape) < 0.4, a, rng.integers(0, 8, shape)).astype(np.uint8)
    a, b = np.asarray(a, order=orders[0]), np.asarray(b, order=orders[1])
    labels = metrics.input_labels(a, b)
    assert labels == sorted(int(v) for v in (set(np.unique(a)) | set(np.unique(b))) - {0})
    assert metrics.registration_dice(a, b, labels=labels) == _naive_dice(a, b, labels)


@pytest.mark.parametrize(
    "low, high, dtype",
    [(0, 255, np.uint8), (-1, 40, np.int16), (0, 32767, np.int16), (0, 40000, np.int32)],
)
def test_label_maps_are_held_in_their_smallest_integer_type(low, high, dtype) -> None:
    data = np.array([[low, high], [0, low]], dtype=np.int32)
    seg = Volume(data, np.eye(4), data.shape)
    compact = compact_labels(seg)
    assert compact.data.dtype == dtype
    np.testing.assert_array_equal(compact.data, data)
    assert compact_labels(compact) is compact  # already compact: no copy


def test_check_finite_counts_every_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(io, "_FINITE_BLOCK", 10)
    field = np.zeros((3, 6, 5), np.float32)
    field[0, 0, 0] = np.nan
    field[2, 5, 4] = np.inf  # in the last block
    with pytest.raises(ValueError, match="got 2 non-finite values"):
        io.check_finite("f", "disp", field)
    io.check_finite("f", "disp", np.zeros((3, 6, 5), np.float32))


def _turned_pair():  # type: ignore[no-untyped-def]
    """The OASIS 2D pair with the moving header turned 12° and shifted: a chained pair."""
    from hyperreg import load_pretrained
    from hyperreg.geometry.io import load_volume
    from hyperreg.registration.pipeline import load_pair

    model = load_pretrained(ndim=2)
    moving = load_volume(REAL[0] / "slice_norm.nii.gz")
    seg = load_volume(REAL[0] / "slice_seg4.nii.gz", label=True)
    # a 12° turn in the slice's own plane about its centre, then 4 mm along its first axis
    axes = moving.affine[:3, :2] / np.linalg.norm(moving.affine[:3, :2], axis=0)
    normal = np.cross(axes[:, 0], axes[:, 1])
    cross = np.array(
        [[0, -normal[2], normal[1]], [normal[2], 0, -normal[0]], [-normal[1], normal[0], 0]]
    )
    angle = np.deg2rad(12.0)
    rotation = np.eye(3) + np.sin(angle) * cross + (1 - np.cos(angle)) * cross @ cross
    centre = moving.affine[:3, :2] @ ((np.array(moving.data.shape) - 1) / 2) + moving.affine[:3, 3]
    turn = np.eye(4)
    turn[:3, :3] = rotation
    turn[:3, 3] = centre - rotation @ centre + 4.0 * axes[:, 0]
    moving = Volume(moving.data, turn @ moving.affine, moving.disk_shape, None, moving.codes)
    seg = Volume(seg.data, turn @ seg.affine, seg.disk_shape, None, seg.codes)
    fixed_seg = REAL[1] / "slice_seg4.nii.gz"
    pair = load_pair(moving, REAL[1] / "slice_norm.nii.gz", model=model, moving_seg=seg,
                     fixed_seg=fixed_seg)  # fmt: skip
    assert pair.chained
    return model, pair, load_volume(fixed_seg, label=True)


def _record_sampling(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Log each full-size output the chain computes and the verdict, in order."""
    log: list[str] = []
    sample, compose = chain_module.sample_volume, chain_module.composed_displacement
    verdict = prepared_module.PreparedPair._verdict

    def sample_volume(volume, transform, disp, fixed, *, label=False, padding="zeros"):  # type: ignore[no-untyped-def]
        log.append("label" if label else "image")
        return sample(volume, transform, disp, fixed, label=label, padding=padding)

    def composed(transform, disp, fixed):  # type: ignore[no-untyped-def]
        log.append("field" if disp is not None else "affine field")
        return compose(transform, disp, fixed)

    def judged(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        log.append("verdict")
        return verdict(self, *args, **kwargs)

    monkeypatch.setattr(chain_module, "sample_volume", sample_volume)
    monkeypatch.setattr(chain_module, "composed_displacement", composed)
    monkeypatch.setattr(prepared_module.PreparedPair, "_verdict", judged)
    return log


@needs_oasis
def test_finish_samples_each_output_once_and_the_rest_after_the_verdict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, pair, fixed_seg = _turned_pair()
    assert pair.moving_seg.data.dtype == np.uint8 and pair.fixed_seg.data.dtype == np.uint8
    log = _record_sampling(monkeypatch)
    result = pair.register(model, [0.5])[0]
    assert result.verdict is not None and result.verdict.kept == "registered"
    # the moved image once, judged, then the label map and the composed field (none twice)
    assert log == ["image", "verdict", "label", "field"]
    chain = pair.chain(result)  # the same outputs as the chain applied afresh
    np.testing.assert_array_equal(result.moved, chain.apply(pair.moving).data)
    np.testing.assert_array_equal(result.moved_seg, chain.apply(pair.moving_seg, label=True).data)
    np.testing.assert_array_equal(result.warp, chain.displacement())
    assert result.moved_seg.dtype == np.int32
    # Dice of the compact maps is that of the int32 maps as read
    assert result.dice == metrics.registration_dice(
        result.moved_seg, fixed_seg.data, labels=pair.labels
    )


@needs_oasis
def test_a_rejected_registration_samples_no_registered_label_map_or_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, pair, _ = _turned_pair()
    log = _record_sampling(monkeypatch)

    def keep_the_affine(*args, **kwargs) -> Verdict:  # type: ignore[no-untyped-def]
        return Verdict(0.1, 0.5, 0.2, kept="affine", reasons=("forced by the test",))

    monkeypatch.setattr(prepared_module, "judge", keep_the_affine)
    result = pair.register(model, [0.5])[0]
    assert result.verdict is not None and result.verdict.kept == "affine"
    # the registered image for the verdict, then the affine alone's three outputs
    assert log == ["image", "verdict", "image", "label", "affine field"]
    alone = pair.chain(None)
    np.testing.assert_array_equal(result.moved, alone.apply(pair.moving).data)
    np.testing.assert_array_equal(result.warp, alone.displacement())
    assert not result.disp.any()
