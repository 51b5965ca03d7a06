"""Applications that run a model on files: register, warp, sweep, tune, batch, evaluate, demo.

One module per application, each a shell around :mod:`hyperreg.registration.pipeline` that
writes files and reports (``inference``, ``native``, ``sweep``, ``tune``, ``batch``,
``evaluate``, ``demo``), and what they share: ``inputs`` (pair CSVs, label-map checks, λ
lists), ``models`` (which model a user means), ``pretrained`` (the bundled models),
``structures`` (FreeSurfer names) and ``plotting``. Imports every layer below; never cli.
"""
