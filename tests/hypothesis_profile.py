"""The suite's Hypothesis profile: no per-example deadline and no "too slow" health check.

Hypothesis fails an example that takes longer than its deadline (200 ms by default), and a
run whose data generation is slow; on a loaded 2-core machine a stall of the process does
either without a bug. Whether the code is fast is for `make bench`; the property tests
check what it does. tests/conftest.py loads this profile before any test module is
imported, so `@settings(...)` on a test (built on the loaded profile) inherits it;
`pytest --hypothesis-profile=NAME` still picks another registered one.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

SUITE_PROFILE = "disque"

settings.register_profile(SUITE_PROFILE, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
