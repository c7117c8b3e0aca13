"""The config fuzzer's long profile: 5,000 drawn settings, each valid within its declaration or
refused in one line (tests/fuzz/test_config.py has the property and the short profile the suite
runs). A benchmark: `python -m pytest -m perf tests/benchmarks/test_fuzz_config_long.py` (about 12
minutes on 2 cores)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.test_config import KEYS, VALUES, check_one_setting

pytestmark = pytest.mark.perf

LONG_EXAMPLES = 5_000


@settings(
    max_examples=LONG_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(key=st.sampled_from(KEYS), value=VALUES)
def test_five_thousand_settings_are_valid_or_refused_in_one_line(
    key: tuple[str, str], value: str
) -> None:
    check_one_setting(key, value)
