"""How many replicas the routers of this process know: what the fleet's ``/health`` waits for.

Ray Serve builds a handle's request router from a copy of its class pickled by value (its module's
globals are a fresh dict in every process), so the routers register here, in a module that is
imported, not copied: the ingress and its routers then see one registry.
"""

from __future__ import annotations

import weakref
from typing import Any

#: The routers made in this process (Ray Serve makes one per deployment handle, once the
#: controller has sent the deployment's configuration). Each has Ray Serve's ``curr_replicas``.
_ROUTERS: weakref.WeakSet[Any] = weakref.WeakSet()


def register(router: Any) -> None:
    """Count ``router``'s replicas in ``replicas_known_here`` while it lives."""
    _ROUTERS.add(router)


def replicas_known_here() -> int:
    """The most replicas a router of this process knows of (0 before the first is made)."""
    return max((len(router.curr_replicas) for router in _ROUTERS), default=0)
