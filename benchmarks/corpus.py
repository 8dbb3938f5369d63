"""The benchmark corpus: MaskBench files, which source each comes from, and seeded samples of them.

A file is ``{"description", "meta", "schema", "tests": [{"valid", "data", ...}]}``. Sources differ
wildly (a Glaive function signature vs. a Kubernetes CRD), so a sample that is to say anything about
the whole must draw from every source; ``sample`` does that, proportionally and reproducibly.
"""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TRAILING_NUMBER = re.compile(r"_\d+$")


@dataclass(frozen=True)
class Instance:
    valid: bool
    data: Any


@dataclass(frozen=True)
class BenchCase:
    """One schema with its test instances."""

    name: str
    source: str
    schema: dict[str, Any] | bool
    tests: tuple[Instance, ...]


def source_of(name: str) -> str:
    """The source prefix of a file name: the part before ``---`` (``Github_hard---o123.json``),
    else the stem without its trailing ``_<number>`` (``BFCL_simple_12.json``, ``JME_98.json``)."""
    stem = Path(name).stem
    if "---" in stem:
        return stem.split("---", 1)[0]
    return _TRAILING_NUMBER.sub("", stem)


def load_case(path: str | Path) -> BenchCase:
    path = Path(path)
    document = json.loads(path.read_text(encoding="utf-8"))
    tests = tuple(Instance(bool(t["valid"]), t["data"]) for t in document.get("tests", []))
    return BenchCase(path.name, source_of(path.name), document["schema"], tests)


def expand_paths(paths: list[str]) -> list[Path]:
    """Files as given, folders as all their ``*.json`` files; sorted, without duplicates."""
    found: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.update(p for p in path.glob("*.json") if p.is_file())
        elif path.is_file():
            found.add(path)
        else:
            raise FileNotFoundError(f"no such file or folder: {raw}")
    return sorted(found)


def sample(files: list[Path], limit: int | None, seed: int) -> list[Path]:
    """A seeded sample of ``limit`` files that covers every source in proportion to its size.

    Each source gets at least one file, so a limit below the number of sources yields one file per
    source. Quotas are rounded by largest remainder; the result is sorted by path.
    """
    if limit is None or limit >= len(files):
        return sorted(files)
    groups: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(files):
        groups[source_of(path.name)].append(path)
    share = {source: limit * len(members) / len(files) for source, members in groups.items()}
    quota = {source: max(1, int(value)) for source, value in share.items()}
    by_remainder = sorted(groups, key=lambda s: (int(share[s]) - share[s], s))
    while sum(quota.values()) < limit:
        grow = next(s for s in by_remainder if quota[s] < len(groups[s]))
        quota[grow] += 1
        by_remainder.remove(grow)
        by_remainder.append(grow)
    while sum(quota.values()) > limit and max(quota.values()) > 1:
        quota[max(quota, key=lambda s: (quota[s], s))] -= 1
    rng = random.Random(seed)
    chosen = [path for source in sorted(groups) for path in rng.sample(groups[source], quota[source])]
    return sorted(chosen)
