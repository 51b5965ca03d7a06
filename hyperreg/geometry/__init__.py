"""Files and geometry: NIfTI/MGZ I/O, displacement files, resampling, the affine stage, and the
names of FreeSurfer structures (``structures``).

nibabel and SimpleITK; never imports model code (``hyperreg.method``) or anything above.
"""
