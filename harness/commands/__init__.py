"""What the commands share above every other package: a command's config composed from its
overrides (`compose`), `--dry-run`'s cells with their predicted times (`dryrun`) and the flags
of the commands that gather facts (`facts_options`: analysis, recommend).

The top layer of `harness` beside `analysis` and `sweeps`: it may import any package below;
only the entry points (`harness/*.py`, `harness.analysis.__main__`) and the launchers import
it.
"""
