"""The operating system's side of a command: process trees (`processes`: finding and ending
them), advisory locks between processes (`filelock`), and a worker's rank, world, master and
listen address as its environment gives them (`worker_env`).

Imports no other package of `harness` and loads no torch: the launchers use it before and
after a cell's workers run.
"""
