"""distbench's engine: configs, workers, distribution models, predictions and analysis.

Importing it registers one exit hook (below), and nothing else: a command's imports stay its
own (tests/meta/test_fast_commands.py).
"""

import atexit
import gc

# A process that has imported torch spends about a second of its exit in the interpreter's last
# garbage collection, walking the millions of objects torch and torchvision made (here 1.5-1.8 s
# of a worker's wall time after its last line, MLflow imported too). Freezing them in an exit
# handler skips that walk (0.3-0.5 s left; docs/benchmarks/2026-12-01-process-exit.md, "Every
# process exits without the last collection's walk (2026-12-01)"). Nothing is lost: every
# exit handler still runs (MLflow's and logging's included: freezing only hides objects from
# the collector), and open files are still closed as their modules are torn down.
atexit.register(gc.freeze)
