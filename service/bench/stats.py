"""Latency percentiles, as every benchmark reports them."""

from __future__ import annotations

from typing import Any

import numpy as np


def percentiles(values: Any) -> dict[str, float | None]:
    """p50/p90/p99/max, rounded for reading; ``None`` when there are no values."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    figures = [float(np.percentile(data, q)) for q in (50, 90, 99)] + [float(data.max())]
    return {key: round(float(v), 3) for key, v in zip(("p50", "p90", "p99", "max"), figures, strict=True)}
