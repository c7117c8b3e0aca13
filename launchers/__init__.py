"""How cells are started: local worker processes (`local`, its job controller `local_controller`,
a job ended when one of its workers dies: `worker_watch`), SLURM jobs (`slurm`, `slurm_resume`),
nodes emulated on this machine (`emulated`), what a launcher does around cells (`cells`, one live
sweep per directory: `sweep_lock`), and how `python -m harness` checks and composes a sweep before
Hydra runs it (`hydra_main`, `config_files`, `swapped_groups`, `cell_pool`; Hydra's private API
in `hydra_private` only).

Above `harness` (it starts the worker, `harness.worker.run`, and records what a cell left) and
below `hydra_plugins` and the entry points that submit cells (`harness.__main__`,
`harness.probe`, `harness.stage_timing`).
"""
