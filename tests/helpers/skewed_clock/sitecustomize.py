"""Put on PYTHONPATH of one ``pluto serve`` in a cluster test: its wall clock runs
``PLUTO_TEST_CLOCK_SKEW`` seconds ahead (time.time and time.time_ns; monotonic clocks are
untouched, as on a machine whose clock is simply set wrong)."""

import os
import time

_skew = float(os.environ.get("PLUTO_TEST_CLOCK_SKEW", "0") or 0)
if _skew:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _skew  # type: ignore[assignment]
    time.time_ns = lambda: _time_ns() + int(_skew * 1e9)  # type: ignore[assignment]
