"""Figures: matplotlib set-up, slices in one display convention, alignment views, λ curves.

Used by the applications (register, sweep, tune, evaluate, demo). Imports only the base layer
(:mod:`hyperreg._files`); never torch, model code or anything above.
"""
