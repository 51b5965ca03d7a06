"""Applications that run a model on files (register, warp, sweep, tune, view, batch, evaluate,
demo) or make one (train).

One module per application, each a shell around :mod:`hyperreg.registration.pipeline` that
writes files and reports: ``register`` (register files), ``transforms`` (the affine stage alone,
applying a saved chain, a field's Jacobian), ``sweep``, ``tune``, ``view`` (the λ explorer, with
``view_server``, ``view_volumes`` and ``view_page``), ``batch``, ``evaluate`` and ``demo``;
``training`` (a training run as a user starts it: a fine-tuned model keeps what it was, and gets
a model card); and what they share: ``inputs`` (pair CSVs, label-map checks, λ lists) and
``models`` (which model a user means: a file, a run folder or a bundled name). Figures come from
:mod:`hyperreg.figures`, the bundled models from :mod:`hyperreg.pretrained`, structure names from
:mod:`hyperreg.geometry.structures`. Imports every layer below; never cli.
"""
