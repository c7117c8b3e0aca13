"""Distribution models. Each is one module here that ends with its `SPEC`
(`harness.distributions.spec`): its settings, its trainer, its time and memory equations, its
recommender candidates and its label; `harness.distributions.registry` finds them. The
modules without a SPEC are what the models share: the trainer protocol (`base`), the
one-replica loop (`loop`), pipeline plumbing (`pipeline`, `onefoneb`) and weight snapshots
(`state`)."""
