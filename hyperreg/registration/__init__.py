"""A model on one prepared pair: the public layer every application and validation builds on.

Imports ``hyperreg.method`` and ``hyperreg.geometry``; never training, apps or cli.
"""
