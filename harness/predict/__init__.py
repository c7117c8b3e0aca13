"""Performance models: seconds per epoch and memory per worker, predicted without running the
distributed job (SPEC chapters 4-6, symbols as in Table 5.1).

The thesis' equations as plain functions (`horovod`: Eq. 5.1's allreduce, `gpipe`: Eq. 6.1's
schedule and Eq. 6.2's transfers, `pipedream`, `memory`), the probe that measures T_seq
(`sequential`) and the terms every prediction is made of (`terms`). Each distribution model's
spec (`harness.distributions.<name>`) puts them together for a cell; `cell.epoch_terms` and
`cell.memory_per_worker_mb` are what the analysis, the recommender and the dry run call.
Units: seconds, MB (10^6 bytes), MB/s.
"""
