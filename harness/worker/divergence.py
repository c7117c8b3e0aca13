"""A training whose loss is no longer finite has diverged: its timings measure arithmetic on
garbage (NaN and infinity propagate at full speed), so the cell stops at the first epoch that
shows it and is recorded `diverged`, not `ok`; a re-run then trains it again
(harness.records.resume).
"""

from __future__ import annotations

import math


class DivergedError(RuntimeError):
    """The loss became NaN or infinite: the message names where and the value."""


def check_finite_losses(batch_losses: dict[int, float], where: str) -> None:
    """Raise DivergedError naming the first batch of the epoch `where` whose loss is not
    finite (batches this worker computed a loss for; an empty dict passes)."""
    for batch in sorted(batch_losses):
        if not math.isfinite(batch_losses[batch]):
            raise DivergedError(f"training loss {batch_losses[batch]} at {where}, batch "
                                f"{batch + 1}: not finite (lower optimizer.lr, or check the "
                                f"data)")


def check_finite_eval_loss(loss: float, where: str) -> None:
    """Raise DivergedError when the evaluation after the epoch `where` gave a non-finite loss."""
    if not math.isfinite(loss):
        raise DivergedError(f"eval loss {loss} after {where}: not finite (lower optimizer.lr, "
                            f"or check the data)")
