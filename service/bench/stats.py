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


def median_interval(values: list[float], level: float = 0.95, resamples: int = 2000) -> tuple[float, float]:
    """A bootstrap interval for the median of ``values`` (seeded, so a report reproduces): where
    the median of repeated runs lies, so that a figure's sign can be called stable or not."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values")
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(data, size=(resamples, data.size), replace=True), axis=1)
    low = float(np.percentile(medians, 100 * (1 - level) / 2))
    high = float(np.percentile(medians, 100 * (1 + level) / 2))
    return low, high
