"""What a worker trains with: its process group (`distributed`), the link it talks through
(`links`: byte counters, shaping on emulated nodes), its data and network (`workload`), the
held-out evaluation after every epoch (`evaluation`), seeds (`seeding`) and the machine it
runs on (`environment`).

Imports `harness.config`, `harness.system` and `harness.measure`; used by the distribution
models' trainers, the records (a cell's machine) and the worker.
"""
