"""What a batch checks and says before any work, so that every rank refuses or warns alike.

:func:`check_batch` checks λ and the contrast and resolves the refinement, :func:`rank_device`
picks a process's device, :func:`check_rerun` refuses (or, with
``overwrite``, announces) a rerun whose settings differ from the finished records
(:func:`hyperreg.apps.batch_records.changed_settings`), and :func:`warn_missing` names the pairs
whose files do not exist. Used by :mod:`hyperreg.apps.batch`. Must not import
:mod:`hyperreg.apps.batch`, train or cli, nor torch at import time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperreg._errors import InputError
from hyperreg.apps.batch_records import changed_settings, read_record

if TYPE_CHECKING:  # annotations only
    from hyperreg.apps.inputs import PairSpec

__all__ = ["check_batch", "check_rerun", "rank_device", "warn_missing"]

logger = logging.getLogger(__name__)


def check_batch(
    fn: str, lam: float | str | None, model: Any, refine: Any, contrast: str = "auto"
) -> Any:
    """Before any work: λ, the contrast (one of
    :data:`~hyperreg.registration.contrast.CONTRAST_CHOICES`), and the refinement resolved
    (None: the model's; none: 0 steps)."""
    from hyperreg._checks import check_option
    from hyperreg.apps.models import check_lambda, pair_refinement
    from hyperreg.registration.contrast import CONTRAST_CHOICES
    from hyperreg.registration.refine import Refinement, check_refinement

    check_option(fn, "contrast", contrast, CONTRAST_CHOICES)
    if isinstance(refine, Refinement):
        check_refinement(fn, refine)
    check_lambda(fn, lam)
    return pair_refinement(model, refine) or Refinement(steps=0)


def rank_device(device: str, world: int, local_rank: int) -> Any:
    """Before any work: the ``torch.device`` of this rank, ``device`` resolved; ``"auto"`` or
    ``"cuda"`` (no index) with several ranks: GPU ``LOCAL_RANK`` (modulo the GPUs present)."""
    import torch

    from hyperreg._checks import resolve_device

    resolved = resolve_device("run_batch", device)
    if resolved.type == "cuda" and resolved.index is None and world > 1:
        resolved = torch.device("cuda", local_rank % torch.cuda.device_count())
    return resolved


def check_rerun(
    fn: str,
    root: Path,
    job: Sequence[PairSpec],
    identity_of: Callable[[PairSpec], dict[str, Any]],
    overwrite: bool,
) -> None:
    """Before any work: the pairs of ``job`` whose finished records (in ``root / <name>``) have
    other settings than ``identity_of(pair)`` are refused (one short :class:`InputError` of
    ``"out"``, naming ``"overwrite"``: the folder, how many pairs, the first two changes) or,
    with ``overwrite``, logged as registered again (with the first names)."""
    stale: dict[str, list[str]] = {}
    for pair in job:
        changed = changed_settings(read_record(root / pair.name), identity_of(pair))
        if changed:
            stale[pair.name] = changed
    if not stale:
        return
    changes = list(dict.fromkeys(c for changed in stale.values() for c in changed))
    what = "; ".join(changes[:3]) + (f" and {len(changes) - 3} more" if len(changes) > 3 else "")
    names = ", ".join(list(stale)[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
    if overwrite:
        logger.info(
            "%d of %d pairs registered again with these settings (%s): %s",
            len(stale),
            len(job),
            what,
            names,
        )
        return
    shown = "; ".join(changes[:2]) + (f" and {len(changes) - 2} more" if len(changes) > 2 else "")
    raise InputError(
        fn,
        "'{out}' holds {count} of {total} pairs registered with other settings ({what}): use "
        "{1} to redo them, another {0}, or the same settings to resume",
        "out",
        "overwrite",
        count=len(stale),
        total=len(job),
        out=root.parent,
        what=shown,
    )


def warn_missing(pairs: Sequence[PairSpec]) -> None:
    """Say before any work which pairs name files that do not exist (they will fail; the
    others run): one line, the first three named."""
    missing = []
    for pair in pairs:
        files = (pair.moving, pair.fixed, pair.moving_seg, pair.fixed_seg, pair.initial_affine)
        files += (pair.fixed_mask, pair.moving_mask)
        gone = [str(path) for path in files if path is not None and not Path(path).exists()]
        if gone:
            missing.append(f"{pair.name} (row {pair.index}): '{gone[0]}'")
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        logger.warning(
            "%d pair(s) name files that do not exist and will fail, the others run: %s%s",
            len(missing),
            "; ".join(missing[:3]),
            more,
        )
