"""The work made beside the affine stage (hyperreg.registration.baseline): the same values as
one step after the other, on a second thread only when torch has more than one."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from lambda_helpers import blob, labels_of

from hyperreg.geometry.io import Volume
from hyperreg.geometry.resample import resample_to
from hyperreg.method.metrics import label_sets, mean_registration_dice
from hyperreg.registration.baseline import beside, pair_baseline


@pytest.fixture()
def threads():  # type: ignore[no-untyped-def]
    """Set torch's thread count for one test, restored after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _record(log: list, name: str, seconds: float = 0.0):  # type: ignore[no-untyped-def]
    def job() -> str:
        log.append((name, "start", threading.get_ident()))
        time.sleep(seconds)
        log.append((name, "end", threading.get_ident()))
        return name

    return job


def test_beside_runs_the_other_job_on_a_second_thread_with_two_threads(threads) -> None:
    threads(2)
    log: list = []
    assert beside(_record(log, "main", 0.3), _record(log, "other", 0.3)) == ("main", "other")
    ids = {name: ident for name, _, ident in log}
    assert ids["main"] == threading.get_ident() and ids["other"] != ids["main"]
    order = [(name, what) for name, what, _ in log]
    assert order.index(("other", "start")) < order.index(("main", "end"))  # at the same time
    assert torch.get_num_threads() == 2


def test_beside_is_one_after_the_other_with_one_thread(threads) -> None:
    threads(1)
    log: list = []
    assert beside(_record(log, "main"), _record(log, "other")) == ("main", "other")
    assert [(n, w) for n, w, _ in log] == [
        ("main", "start"),
        ("main", "end"),
        ("other", "start"),
        ("other", "end"),
    ]
    assert {ident for *_, ident in log} == {threading.get_ident()}


def test_beside_raises_the_main_jobs_error_first(threads) -> None:
    threads(2)

    def fails(text: str):  # type: ignore[no-untyped-def]
        def job() -> None:
            raise ValueError(text)

        return job

    with pytest.raises(ValueError, match="main"):
        beside(fails("main"), fails("other"))
    with pytest.raises(ValueError, match="other"):
        beside(lambda: 1, fails("other"))


def test_pair_baseline_is_the_pairs_labels_and_dice_as_it_came() -> None:
    """Label maps on other grids than the fixed image are brought onto it through the headers
    (as the pipeline does) before they are counted and scored."""
    shape = (20, 18, 22)
    fixed = Volume(blob(shape, (11, 9, 12), sigma=4.0), np.eye(4), shape)
    moving = Volume(blob(shape, (9, 8, 10), sigma=4.0), np.eye(4), shape)
    shifted = np.eye(4)
    shifted[:3, 3] = (1.0, -1.0, 0.5)
    moving_seg = Volume(labels_of(moving.data).astype(np.int32), shifted, shape)
    fixed_seg = Volume(labels_of(fixed.data).astype(np.int32), shifted, shape)
    base = pair_baseline(fixed, moving_seg, fixed_seg)
    on_fixed = [resample_to(s, fixed, label=True).data for s in (moving_seg, fixed_seg)]
    labels, shared = label_sets(*on_fixed)
    assert (base.labels, base.shared) == (labels, shared)
    assert base.dice_before == mean_registration_dice(*on_fixed, labels=labels)
    assert pair_baseline(fixed, None, fixed_seg).labels is None
