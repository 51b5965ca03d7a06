"""Training: data sources and synthesis, the loop, checkpoints, torchrun, validation.

Imports the layers below (method, geometry, registration); never apps or cli.
"""
