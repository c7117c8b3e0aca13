"""distbench's engine: configs, workers, distribution models, predictions and analysis.

Importing it registers one exit hook (below), and nothing else: a command's imports stay its
own (tests/test_fast_commands.py).
"""

import atexit
import gc

# A process that has imported torch spends about a second of its exit in the interpreter's last
# garbage collection, walking the millions of objects torch and torchvision made (here 1.0-1.2 s
# of a command's wall time, and of every worker's, after its last line). Freezing them in an
# exit handler skips that walk (0.2-0.3 s left). Nothing is lost: every exit handler still
# runs (MLflow's and logging's included: freezing only hides objects from the collector), and
# open files are still closed as their modules are torn down (reference counts).
atexit.register(gc.freeze)
