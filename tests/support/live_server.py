"""The tests' view of a live server: ``bench load``'s launcher (``service/bench/live_server.py``,
which starts, waits for, measures and stops one) and what only the tests ask of a server, how it
ended by itself."""

from __future__ import annotations

import subprocess

from tokenmold.service.bench.live_server import LiveServer


class SuiteServer(LiveServer):
    """A live server of the suite (``support/servers.py``)."""

    def wait_exit(self, timeout_s: float) -> int | None:
        """The server's exit status once it exits by itself (``None`` if still running after
        ``timeout_s``): fault tests check that a server that must stop does, with the right status."""
        assert self._proc is not None
        try:
            return self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
