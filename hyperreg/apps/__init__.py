"""Applications that run a model on files: register, warp, sweep, tune, batch, evaluate, demo.

Imports every layer below; never cli.
"""
