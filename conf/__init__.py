"""distbench's Hydra configs (`conf/`), installed as the package `harness.conf`."""
