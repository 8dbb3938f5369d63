"""``tokenmold ray serve`` and ``ray batch`` refuse a bad command line (``BadInput``: exit 2 with one
line, as every command's) before any Ray cluster or replica starts; the fleet itself is
``test_fleet.py``."""

from __future__ import annotations

import socket

import pytest

from tokenmold.service.cli.main import _parser
from tokenmold.service.errors import BadInput


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["ray", "serve", "--replicas", "0"], "--replicas must be at least 1"),
        (["ray", "serve", "--replicas", "3", "--max-replicas", "2"], "--min-replicas <= --replicas <= --max-replicas"),
        (["ray", "batch", "-i", "in.jsonl", "-o", "out.jsonl", "--min-replicas", "2"], "(got 2, 1, 1)"),
    ],
)
def test_bad_counts_are_refused_before_ray_starts(args: list[str], fragment: str) -> None:
    parsed = _parser().parse_args(args)
    with pytest.raises(BadInput, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parsed.func(parsed)


def test_a_taken_port_is_refused_before_ray_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        parsed = _parser().parse_args(["ray", "serve", "--port", str(taken.getsockname()[1])])
        with pytest.raises(BadInput, match="cannot listen on"):
            parsed.func(parsed)
