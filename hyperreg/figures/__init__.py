"""Figures: matplotlib set-up, slices in one display convention, alignment views, λ curves.

``backend`` (:func:`~hyperreg.figures.backend.pyplot` with the Agg backend,
:func:`~hyperreg.figures.backend.save_figure`), ``slices`` (:data:`DISPLAY_CONVENTION
<hyperreg.figures.slices.DISPLAY_CONVENTION>`, ``oriented_slice``, ``show_slice``,
``checkerboard``), ``overlays`` (``edge_mask``, ``label_boundaries``, ``overlay_edges``),
``alignment`` (``alignment_figure``, the register figure), ``curves``
(``plot_lambda_curves``, ``sweep_curves``), ``planes`` (``pair_planes``: the planes of a pair as
images for the batch report) and ``structures`` (``structure_boxplots``, evaluate's box plot).
Used by the applications (register, sweep, tune, evaluate, demo, batch).
Imports only the base layer (:mod:`hyperreg._files`); never torch, model code or anything above.
"""
