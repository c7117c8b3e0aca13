"""Every free parameter of the time equations: the two every multi-worker model shares
(`harness.costs.terms.SHARED_PARAMETERS`: contention, communication), then those the models
declare for terms of their own (`DistributionSpec.free_parameters`, in the registry's order),
and all of them at their raw values. What a fit fits and a report lists
(`harness.analysis.fit`)."""

from __future__ import annotations

from harness.costs.terms import SHARED_PARAMETERS, FreeParameter
from harness.distributions.registry import specs


def _every_parameter() -> dict[str, FreeParameter]:
    found: dict[str, FreeParameter] = {parameter.name: parameter for parameter in SHARED_PARAMETERS}
    for spec in specs().values():
        for parameter in spec.free_parameters:
            if found.setdefault(parameter.name, parameter) is not parameter:
                raise TypeError(
                    f"distribution={spec.name} declares the free parameter "
                    f"{parameter.name!r}, which another model or the shared "
                    f"equations already define differently"
                )
    return found


PARAMETERS: dict[str, FreeParameter] = _every_parameter()
# Every free parameter at its raw (prior) value: the equations as derived, before any fit.
RAW: dict[str, float] = {name: parameter.prior for name, parameter in PARAMETERS.items()}
