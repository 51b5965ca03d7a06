"""The method: warp, losses, metrics, the MIP hypernetwork, the U-Net and HyperMorph (torch only).

Imports only ``hyperreg._checks``, ``hyperreg._files`` and ``hyperreg.config`` from outside.
"""
