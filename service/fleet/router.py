"""Ray Serve's request-router interface, choosing replicas by shape (``affinity.py``).

Ray Serve calls ``choose_replicas`` with the live replicas and the pending request; it returns
ranks, best first, and Ray Serve sends the request to the first replica of the first rank that has
room (``max_ongoing_requests``), so a replica that is full or gone costs nothing but the next rank.
The load the bound counts is this router's own count of requests in flight per replica, kept by
Ray Serve's ``on_request_routed``/``on_request_completed`` hooks: exact where one ingress replica
routes, an undercount where several do (each sees its share).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from ray.serve.request_router import LocalityMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from tokenmold.service.fleet import known_replicas
from tokenmold.service.fleet.affinity import DEFAULT_EPSILON, affinity_order


def request_shape_key(pending_request: PendingRequest | None) -> str | None:
    """The shape key the caller put on the request: the ``shape_key`` attribute of its first
    positional argument (a ``ForwardedRequest`` or a batch line), if any."""
    if pending_request is None or not pending_request.args:
        return None
    key = getattr(pending_request.args[0], "shape_key", None)
    return key if isinstance(key, str) else None


class ShapeAffinityRouter(LocalityMixin, RequestRouter):
    """A shape's requests go to its home replica, load bounded; requests without a shape (and every
    request with ``affinity=False``) go to the less loaded of two replicas picked at random."""

    #: How long a replica may take to tell its queue length (asked while Ray Serve's cache of it is
    #: empty or stale) before Ray Serve passes it over for the next rank; Ray's default is 0.1 s,
    #: doubled per retry up to 1 s. A replica busy compiling answers later than that on a loaded
    #: host, and passing a shape's home over sends it to a replica that compiles it cold, seconds
    #: lost: waiting up to a second for the home is the cheaper mistake (and costs nothing where a
    #: replica answers in time).
    queue_len_response_deadline_s = 1.0
    max_queue_len_response_deadline_s = 2.0

    def initialize_state(self, affinity: bool = True, epsilon: float = DEFAULT_EPSILON, **_: Any) -> None:
        self._affinity = affinity
        self._epsilon = epsilon
        self._in_flight: Counter[ReplicaID] = Counter()
        self._routed_to: dict[str, ReplicaID] = {}
        #: Requests whose completion Ray Serve reported before their routing (a fast one can end
        #: while its replica's acceptance is still being read): never counted as in flight.
        self._ended_unrouted: set[str] = set()
        known_replicas.register(self)  # for the fleet's /health

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = request_shape_key(pending_request) if self._affinity else None
        if key is None:
            return [random.sample(candidate_replicas, k=min(2, len(candidate_replicas)))]
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        loads = {unique_id: self._in_flight[replica.replica_id] for unique_id, replica in by_id.items()}
        return [[by_id[unique_id]] for unique_id in affinity_order(key, loads, self._epsilon)]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        request_id = pending_request.metadata.internal_request_id
        if request_id in self._ended_unrouted:
            self._ended_unrouted.discard(request_id)
            return
        self._in_flight[replica_id] += 1
        self._routed_to[request_id] = replica_id

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        routed_to = self._routed_to.pop(internal_request_id, None)
        if routed_to is None:
            self._ended_unrouted.add(internal_request_id)
        elif self._in_flight[routed_to] > 0:
            self._in_flight[routed_to] -= 1
