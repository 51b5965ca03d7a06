"""A model on a prepared pair: the public layer every application and validation builds on.

``pipeline`` (a pair read once, its affine stage once, registered at any λ with typed results
from ``results``), ``pairs`` (grids, model inputs, one λ), ``lambdas`` (many λ in batched
passes), ``refine`` (test-time refinement), ``chain`` (affine and field sampled once).
Imports ``hyperreg.method`` and ``hyperreg.geometry``; never training, apps or cli.
"""
