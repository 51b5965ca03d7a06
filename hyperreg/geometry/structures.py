"""Structure names for FreeSurfer label ids (a subset of ``FreeSurferColorLUT.txt``).

:data:`FREESURFER_NAMES` covers the aseg structures that FreeSurfer, SAMSEG and the Mindboggle
"CMA" labels use, and the cortical parcels of the Desikan-Killiany(-Tourville) atlases
(``ctx-lh-*`` = 1000 + parcel, ``ctx-rh-*`` = 2000 + parcel). :func:`structure_names` decides
whether a label map's ids are FreeSurfer's. Data only: imports nothing from hyperreg.

References:
    FreeSurfer ``FreeSurferColorLUT.txt`` (Fischl, NeuroImage 2012); Klein and Tourville,
    101 labeled brain images and a consistent human cortical labeling protocol (DKT),
    Front. Neurosci. 2012.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["FREESURFER_NAMES", "LABEL_NAMING", "structure_names"]

LABEL_NAMING = ("auto", "freesurfer", "none")

_ASEG = {
    2: "Left-Cerebral-White-Matter",
    3: "Left-Cerebral-Cortex",
    4: "Left-Lateral-Ventricle",
    5: "Left-Inf-Lat-Vent",
    7: "Left-Cerebellum-White-Matter",
    8: "Left-Cerebellum-Cortex",
    10: "Left-Thalamus",
    11: "Left-Caudate",
    12: "Left-Putamen",
    13: "Left-Pallidum",
    14: "3rd-Ventricle",
    15: "4th-Ventricle",
    16: "Brain-Stem",
    17: "Left-Hippocampus",
    18: "Left-Amygdala",
    24: "CSF",
    26: "Left-Accumbens-area",
    28: "Left-VentralDC",
    30: "Left-vessel",
    31: "Left-choroid-plexus",
    41: "Right-Cerebral-White-Matter",
    42: "Right-Cerebral-Cortex",
    43: "Right-Lateral-Ventricle",
    44: "Right-Inf-Lat-Vent",
    46: "Right-Cerebellum-White-Matter",
    47: "Right-Cerebellum-Cortex",
    49: "Right-Thalamus",
    50: "Right-Caudate",
    51: "Right-Putamen",
    52: "Right-Pallidum",
    53: "Right-Hippocampus",
    54: "Right-Amygdala",
    58: "Right-Accumbens-area",
    60: "Right-VentralDC",
    62: "Right-vessel",
    63: "Right-choroid-plexus",
    72: "5th-Ventricle",
    77: "WM-hypointensities",
    78: "Left-WM-hypointensities",
    79: "Right-WM-hypointensities",
    80: "non-WM-hypointensities",
    81: "Left-non-WM-hypointensities",
    82: "Right-non-WM-hypointensities",
    85: "Optic-Chiasm",
    251: "CC_Posterior",
    252: "CC_Mid_Posterior",
    253: "CC_Central",
    254: "CC_Mid_Anterior",
    255: "CC_Anterior",
}

_CORTEX = {
    1: "bankssts",
    2: "caudalanteriorcingulate",
    3: "caudalmiddlefrontal",
    5: "cuneus",
    6: "entorhinal",
    7: "fusiform",
    8: "inferiorparietal",
    9: "inferiortemporal",
    10: "isthmuscingulate",
    11: "lateraloccipital",
    12: "lateralorbitofrontal",
    13: "lingual",
    14: "medialorbitofrontal",
    15: "middletemporal",
    16: "parahippocampal",
    17: "paracentral",
    18: "parsopercularis",
    19: "parsorbitalis",
    20: "parstriangularis",
    21: "pericalcarine",
    22: "postcentral",
    23: "posteriorcingulate",
    24: "precentral",
    25: "precuneus",
    26: "rostralanteriorcingulate",
    27: "rostralmiddlefrontal",
    28: "superiorfrontal",
    29: "superiorparietal",
    30: "superiortemporal",
    31: "supramarginal",
    32: "frontalpole",
    33: "temporalpole",
    34: "transversetemporal",
    35: "insula",
}

FREESURFER_NAMES: dict[int, str] = {
    **_ASEG,
    **{1000 + k: f"ctx-lh-{v}" for k, v in _CORTEX.items()},
    **{2000 + k: f"ctx-rh-{v}" for k, v in _CORTEX.items()},
}


def structure_names(labels: Iterable[int], naming: str = "auto") -> dict[int, str]:
    """Names for ``labels``: FreeSurfer's where the ids are FreeSurfer's, else the id itself.

    Args:
        labels: Non-zero label ids.
        naming: ``"freesurfer"`` (names from :data:`FREESURFER_NAMES`, the id for unknown ids),
            ``"none"`` (ids as text) or ``"auto"``: FreeSurfer names when **every** id is in the
            table and at least one is ``>= 41`` (a right-hemisphere or cortical id). Renumbered
            maps such as neurite-oasis ``seg35`` (1 = left white matter, not FreeSurfer's 2)
            then keep their numbers.

    Returns:
        ``{label: name}`` for every label.

    Raises:
        ValueError: If ``naming`` is not one of :data:`LABEL_NAMING`.
    """
    if naming not in LABEL_NAMING:
        raise ValueError(
            f"structure_names(): 'naming' must be one of {LABEL_NAMING}, got {naming!r}"
        )
    ids = sorted({int(label) for label in labels})
    use = naming == "freesurfer" or (
        naming == "auto"
        and bool(ids)
        and all(i in FREESURFER_NAMES for i in ids)
        and max(ids) >= 41
    )
    return {i: FREESURFER_NAMES.get(i, str(i)) if use else str(i) for i in ids}
