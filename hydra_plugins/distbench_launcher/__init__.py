"""Hydra launcher plugins of distbench (Hydra only instantiates launchers found in the
`hydra_plugins` namespace): `serial_local` and `slurm_cells`. What they do around cells lives in
`launchers/`; `names` also stores them as `submitit_local`/`submitit_slurm`.
"""
