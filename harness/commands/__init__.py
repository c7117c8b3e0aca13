"""What the commands share above every other package: a command's config composed from its
overrides (`compose`) and `--dry-run`'s cells with their predicted times (`dryrun`).

The top layer of `harness` beside `analysis` and `sweeps`: it may import any package below;
only the entry points (`harness/*.py`) and the launchers import it.
"""
