"""How sure a cell's seconds per epoch is, as a line or a table shows it.

The spread that says whether two cells differ is the spread between independent runs of a
cell: its repeats (`run.repeats`, MLPerf's runs), each from its own seed. A cell of one
repeat measured no such spread: its standard deviation would read 0.000 and look like
certainty, so it is never printed as a number; "1 repeat: no spread" (a line) or "-" with a
footnote (a table) say so instead. (The spread of one repeat's epochs is not it: its epochs
share a process, a seed and a warm machine.)
"""

from __future__ import annotations

from collections.abc import Mapping

NO_SPREAD = "1 repeat: no spread"
STD_FOOTNOTE = (
    "std: over the cell's repeats; '-': 1 repeat, no spread measured "
    "(run.repeats=3 or more measures one)"
)


def repeat_std(metrics: Mapping[str, float]) -> float | None:
    """The standard deviation of seconds per epoch over the cell's repeats; None for one
    repeat (or a record without it)."""
    if metrics.get("repeats", 1) < 2:
        return None
    return metrics.get("seconds_per_epoch_repeat_std")


def spread_text(metrics: Mapping[str, float]) -> str:
    """'3 repeats: std 0.123, 95 % interval [4.01, 4.55]', or '1 repeat: no spread'."""
    std = repeat_std(metrics)
    if std is None:
        return NO_SPREAD
    text = f"{int(metrics['repeats'])} repeats: std {std:.3f}"
    low = metrics.get("seconds_per_epoch_ci95_low")
    high = metrics.get("seconds_per_epoch_ci95_high")
    if low is not None and high is not None:
        text += f", 95 % interval [{low:.3f}, {high:.3f}]"
    return text


def std_column(metrics: Mapping[str, float]) -> str:
    """A table's std: the repeats' standard deviation, or '-' (then print STD_FOOTNOTE)."""
    std = repeat_std(metrics)
    return "-" if std is None else f"{std:.3f}"


def student_t_975(degrees_of_freedom: float) -> float:
    """The 97.5 % quantile of Student's t: a two-sided 95 % interval's half-width in standard
    errors (12.706 for 1 degree of freedom, 2.776 for 4, 1.96 in the limit); fractional
    degrees of freedom (Welch's) are allowed. The one place either interval takes it from:
    a cell's repeats (harness.measure.metrics) and a ratio of two cells (harness.sweeps.compare)."""
    from scipy import stats  # imported here: only cells with repeats need it

    return float(stats.t.ppf(0.975, degrees_of_freedom))
