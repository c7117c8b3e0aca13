"""PipeDream's 1F1B schedule with replicated stages, as plain data, and a proof that it cannot
deadlock.

Minibatch m enters stage s at replica `m % replicas[s]` (round robin), so replica j of stage s
trains minibatches j, j + r, j + 2r, ... Each worker runs a fixed list of operations:

- F(m): forward of minibatch m. Needs the activation of F(m) from the previous stage (and, on
  the last stage, m's labels from the first stage).
- B(m): backward of minibatch m, then the weight update. Needs the gradient of B(m) from the
  next stage. On a replicated stage it ends in an allreduce of the stage's gradients, the k-th
  backward of every replica joining the k-th allreduce (the same count on every replica is
  what batch division guarantees).

Warm-up: a worker first runs `warmup` forwards, then alternates B and F (one backward, one
forward: 1F1B) and drains the remaining backwards at the end of the epoch; nothing is flushed
between minibatches. `warmup` is the number of its minibatches in flight in steady state:
ceil(workers of stages s..S-1 / replicas of s), i.e. S - s without replication, the PipeDream
paper's NOAM per stage.

Deadlock freedom: sends never block (isend), receives and allreduces do. With fixed op lists
and non-blocking sends the workers form a Kahn process network, whose outcome does not depend
on timing: if one execution finishes, every execution does. `simulate` runs one (unit-time)
execution; `check_deadlock_free` raises if it gets stuck, and the trainer calls it before the
first batch, so a schedule that could deadlock is refused instead of run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    forward = "F"
    backward = "B"


@dataclass(frozen=True)
class Op:
    kind: Kind
    minibatch: int

    def __repr__(self) -> str:
        return f"{self.kind.value}{self.minibatch}"


def replica_of(minibatch: int, replicas: int) -> int:
    """The replica of a stage with `replicas` replicas that trains `minibatch` (round robin)."""
    return minibatch % replicas


def minibatches_of(replica: int, replicas: int, batches: int) -> list[int]:
    return list(range(replica, batches, replicas))


def warmup_forwards(replicas: list[int], stage: int) -> int:
    """Forwards a worker of `stage` runs before its first backward (see the module docstring)."""
    return math.ceil(sum(replicas[stage:]) / replicas[stage])


def worker_ops(replicas: list[int], stage: int, replica: int, batches: int) -> list[Op]:
    """The 1F1B operation list of replica `replica` of stage `stage` over `batches` minibatches."""
    mine = minibatches_of(replica, replicas[stage], batches)
    warmup = min(len(mine), warmup_forwards(replicas, stage))
    ops = [Op(Kind.forward, m) for m in mine[:warmup]]
    forwards = warmup
    for m in mine:
        ops.append(Op(Kind.backward, m))
        if forwards < len(mine):
            ops.append(Op(Kind.forward, mine[forwards]))
            forwards += 1
    return ops


def divisible_batches(batches: int, replicas: list[int], oversample: bool) -> int:
    """The nearest batch count that every replica of every stage shares evenly: the multiple of
    lcm(replicas) below `batches` (drop) or above it (oversample)."""
    step = math.lcm(*replicas)
    return (math.ceil(batches / step) if oversample else batches // step) * step


class DeadlockError(RuntimeError):
    """A schedule whose workers would wait for each other forever."""


def simulate(replicas: list[int], batches: int) -> int:
    """Run every worker's op list in unit-time rounds; return the rounds the epoch takes.

    In a round every worker whose next op has its inputs (produced in earlier rounds) runs it;
    an allreduce runs when all replicas of the stage have reached it. Raises DeadlockError if
    a round makes no progress before all ops are done.
    """
    stages = len(replicas)
    workers = [(s, j) for s in range(stages) for j in range(replicas[s])]
    ops = {w: worker_ops(replicas, w[0], w[1], batches) for w in workers}
    position = {w: 0 for w in workers}
    # An op is "pending the allreduce" after its backward ran on a replicated stage.
    awaiting_allreduce: dict[tuple[int, int], bool] = {w: False for w in workers}
    done: set[tuple[Kind, int, int]] = set()  # (kind, stage, minibatch)
    rounds = 0
    while any(position[w] < len(ops[w]) or awaiting_allreduce[w] for w in workers):
        rounds += 1
        finished: list[tuple[Kind, int, int]] = []
        progressed = False
        for s in range(stages):
            stage_workers = [(s, j) for j in range(replicas[s])]
            if all(awaiting_allreduce[w] for w in stage_workers):
                for w in stage_workers:
                    awaiting_allreduce[w] = False
                progressed = True
        for w in workers:
            if awaiting_allreduce[w] or position[w] >= len(ops[w]):
                continue
            s, op = w[0], ops[w][position[w]]
            if op.kind is Kind.forward:
                # (The last stage's labels come from F(m) on stage 0, which precedes this.)
                ready = s == 0 or (Kind.forward, s - 1, op.minibatch) in done
            else:
                ready = s == stages - 1 or (Kind.backward, s + 1, op.minibatch) in done
            if ready:
                finished.append((op.kind, s, op.minibatch))
                position[w] += 1
                awaiting_allreduce[w] = op.kind is Kind.backward and replicas[s] > 1
                progressed = True
        done.update(finished)
        if not progressed:
            stuck = {
                f"stage {w[0]} replica {w[1]}": ops[w][position[w]]
                if position[w] < len(ops[w])
                else "allreduce"
                for w in workers
            }
            raise DeadlockError(
                f"stages {'-'.join(map(str, replicas))} with {batches} "
                f"minibatches deadlock; next ops: {stuck}"
            )
    return rounds


def check_deadlock_free(replicas: list[int], batches: int) -> None:
    simulate(replicas, batches)
