"""A model on a prepared pair: the public layer every application and validation builds on.

``pipeline`` (a pair read once, its affine stage once) and ``prepared`` (the prepared pair
registered at any λ with typed results from ``results``), ``settings`` (one registration's
settings, resolved once; ``defaults``, beside it: what a model registers with when a λ or
refinement is not asked for, resolved for a pair) and ``engine`` (the one path that runs them:
passes, λ batches, refinement, the verdict), ``pairs`` (grids, model inputs, one λ), ``lambdas``
(many λ in batched passes), ``refine`` (test-time refinement), ``chain`` and ``transform_chain``
(affine and field sampled once, composed, inverted), ``verdict`` (``ok`` or ``check: <reason>``
per pair, and the never-worse rule), ``similarity`` (the model's similarity of a pair on the
network grid, which the verdict compares) and ``contrast`` (whether the two images' contrasts
differ).
Imports ``hyperreg.method`` and ``hyperreg.geometry``; never training, apps or cli.
"""
