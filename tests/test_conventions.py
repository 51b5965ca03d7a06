"""Label conventions: synthesis from every convention in the shared data folder, pairs only
within one convention, and the anatomy-aware 3D data path (conformed grids, label index maps)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared_paths import data_path
from hyperreg.config import ModelConfig, TrainConfig
from hyperreg.training.data import MixtureSampler
from hyperreg.training.sources import Scan, label_map_scans
from hyperreg.training.synth import SynthPairSampler, label_maps_from_scans

SHAPE = (48, 56, 48)  # 4 mm: a head fits, synthesis is fast

CONVENTIONS = {
    "FreeSurfer aseg + extra-cerebral (SynthSeg 2021)": ("synthseg-labelmaps", "2021",
                                                         "training_seg_01.nii.gz"),
    "left/right merged (SynthSeg 2020)": ("synthseg-labelmaps", "2020", "subject01_seg.nii.gz"),
    "GIF parcellation": ("misc-3d", "fernando_gif_labels.nii.gz"),
    "DLMUSE": ("ixi-2mm", "IXI174-HH-1571_DLMUSE.nii.gz"),
    "seg35 (neurite-oasis)": ("neurite-oasis", "OASIS_OAS1_0001_MR1", "aligned_seg35.nii.gz"),
    "FreeSurfer aseg (native 256³)": ("oasis1-freesurfer", "OAS1_0001_MR1", "aseg.mgz"),
}


@pytest.mark.slow  # reads six label maps of up to 256³ (about 20 s); CI runs the slow tests
@pytest.mark.parametrize("parts", CONVENTIONS.values(), ids=list(CONVENTIONS))
def test_synthesis_from_each_convention(parts) -> None:
    path = data_path(*parts)
    maps = label_maps_from_scans([Scan(path, path)], 3, shape=SHAPE, spacing=4.0,
                                 orientation="RAS", centre=True)
    assert len(maps) == 1 and maps[0].shape == SHAPE
    ids = set(np.unique(maps[0]).tolist()) - {0}
    assert len(ids) >= 3
    sampler = SynthPairSampler(maps, 3, max_labels=8)
    batch = sampler.sample_batch(2, torch.Generator().manual_seed(0))
    assert batch.moving.shape == (2, 1, *SHAPE)
    assert 0.0 <= float(batch.moving.min()) and float(batch.moving.max()) <= 1.0
    assert not batch.image_pairs.any()  # random contrasts: the label term alone
    for index_map in (batch.moving_labels, batch.fixed_labels):
        assert index_map.dtype == torch.int16 and int(index_map.max()) <= 8
    # the same index means the same label on both sides: matched indices overlap far more
    # than indices shifted by one (a mismatched convention would look like the shifted case)
    moving, fixed = batch.moving_labels, batch.fixed_labels
    top = int(fixed.max())
    shifted = torch.where(fixed > 0, fixed % top + 1, fixed)
    same = ((moving == fixed) & (fixed > 0)).sum()
    other = ((moving == shifted) & (shifted > 0)).sum()
    assert float(same) > 2 * float(other)


def test_a_folder_of_label_maps_is_a_synthesis_source() -> None:
    folder = data_path("synthseg-labelmaps", "2020")
    scans = label_map_scans(folder, 3)
    assert len(scans) == 20 and all(scan.seg == scan.image for scan in scans)


@pytest.mark.slow  # a training run, subprocesses or benchmark runs: CI's slow step
def test_synthetic_pairs_never_mix_conventions(tmp_path) -> None:
    """Each synthesis source is its own sampler: the two maps of a pair share a convention."""
    from hyperreg.training.prepare import _synth_sampler

    a = data_path("synthseg-labelmaps", "2020", "subject01_seg.nii.gz")
    b = data_path("misc-3d", "fernando_gif_labels.nii.gz")
    config = TrainConfig(synth=1.0, synth_labels=(str(a), str(b)), spacing=4.0, conform=True,
                         shape=SHAPE, model=ModelConfig(ndim=3))
    sampler, count = _synth_sampler(config, [], SHAPE, "RAS")
    assert count == 2 and isinstance(sampler, MixtureSampler)
    assert [len(s.label_maps) for s in sampler.samplers] == [1, 1]
