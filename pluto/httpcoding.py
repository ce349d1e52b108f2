"""What an HTTP client said it can decode: shared by every part that serves compressed files
(the widget's assets, the console's)."""

from __future__ import annotations

import re


def accepts_gzip(header: str) -> bool:
    """Whether ``Accept-Encoding`` allows gzip (``gzip`` or ``*`` without ``q=0``)."""
    allowed: dict[str, bool] = {}
    for part in header.lower().split(","):
        coding, _, params = part.strip().partition(";")
        q = re.search(r"q\s*=\s*([^;\s]*)", params)
        try:
            allowed[coding.strip()] = float(q.group(1)) > 0 if q else True
        except ValueError:
            allowed[coding.strip()] = False
    return allowed.get("gzip", allowed.get("x-gzip", allowed.get("*", False)))
