"""The fleet's routing key and replica order (``service/fleet/affinity.py``), without Ray."""

from __future__ import annotations

import collections
import random

from tokenmold.service.fleet.affinity import affinity_order, capacity, rendezvous_order, shape_key

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}}


def _chat(**fields: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_the_key_is_the_shape_not_the_prompt_or_the_sampling() -> None:
    shaped = {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}
    key = shape_key("/v1/chat/completions", _chat(**shaped))
    assert key is not None
    other_prompt = {**_chat(**shaped), "messages": [{"role": "user", "content": "another"}]}
    assert shape_key("/v1/chat/completions", other_prompt) == key
    assert shape_key("/v1/chat/completions", _chat(**shaped, temperature=0.3, seed=4, max_tokens=9)) == key
    other_schema = {
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "integer"}}}
    }
    assert shape_key("/v1/chat/completions", _chat(**other_schema)) != key
    assert shape_key("/v1/chat/completions", _chat(**shaped, budget="fit")) != key
    assert shape_key("/v1/chat/completions", _chat(tools=[{"type": "function", "function": {"name": "f"}}])) is not None


def test_requests_without_a_shape_have_no_key() -> None:
    assert shape_key("/v1/chat/completions", _chat()) is None
    assert shape_key("/v1/chat/completions", _chat(temperature=0.2, stream=True)) is None
    assert shape_key("/v1/files", {"purpose": "batch"}) is None
    assert shape_key("/v1/chat/completions", ["not", "an", "object"]) is None


def test_rendezvous_order_is_stable_and_a_leaving_replica_moves_only_its_keys() -> None:
    replicas = ["a", "b", "c", "d"]
    keys = [f"shape-{n}" for n in range(400)]
    homes = {key: rendezvous_order(key, replicas)[0] for key in keys}
    assert homes == {key: rendezvous_order(key, list(reversed(replicas)))[0] for key in keys}
    assert min(collections.Counter(homes.values()).values()) > 60  # spread over every replica
    after = {key: rendezvous_order(key, ["a", "b", "d"])[0] for key in keys}
    assert all(after[key] == homes[key] for key in keys if homes[key] != "c")


def test_bounded_loads_pass_over_a_replica_past_its_capacity() -> None:
    key = "shape-7"
    home, second = rendezvous_order(key, ["a", "b"])
    assert affinity_order(key, {"a": 0, "b": 0})[0] == home
    idle = {home: 0, second: 0}
    busy = {home: capacity(idle | {home: 3, second: 1}), second: 1}
    assert affinity_order(key, busy) == [second, home]
    assert affinity_order(key, {home: 2, second: 2}) == [home, second]  # balanced: the home keeps it


def test_a_flooding_shape_is_only_ever_sent_to_a_replica_under_the_bound() -> None:
    loads = {name: 0 for name in "abcd"}
    rng = random.Random(3)
    for _ in range(200):
        choice = affinity_order("hot", loads)[0]
        bound = capacity(loads)
        assert loads[choice] < bound
        loads[choice] += 1
        if rng.random() < 0.3:  # some requests end
            finished = rng.choice([name for name, load in loads.items() if load] or ["a"])
            loads[finished] = max(0, loads[finished] - 1)
    assert min(loads.values()) > 0, "the flood spilled over every replica"


def test_a_shapes_home_is_given_longer_than_rays_default_to_tell_its_queue() -> None:
    """A replica busy compiling on a loaded host answers Ray Serve's queue-length probe after
    0.1 s: with Ray's deadline the home was passed over and the shape compiled cold elsewhere."""
    from ray.serve.request_router import RequestRouter

    from tokenmold.service.fleet.router import ShapeAffinityRouter

    assert ShapeAffinityRouter.queue_len_response_deadline_s >= 10 * RequestRouter.queue_len_response_deadline_s


def test_the_fleets_health_counts_the_replicas_its_routers_know() -> None:
    from tokenmold.service.fleet import known_replicas

    class Router:
        def __init__(self, replicas: int) -> None:
            self.curr_replicas = {f"r{number}": object() for number in range(replicas)}

    before = known_replicas.replicas_known_here()
    routers = [Router(before + 1), Router(before + 3)]
    for router in routers:
        known_replicas.register(router)
    assert known_replicas.replicas_known_here() == before + 3
    del routers, router
    assert known_replicas.replicas_known_here() == before, "a router gone no longer counts"


def test_a_router_copied_by_ray_serve_registers_where_the_ingress_looks() -> None:
    """Ray Serve ships the router's class pickled by value (its module's globals a fresh copy in
    the process that loads it): the registry the ingress reads must still be the imported one."""
    import subprocess
    import sys

    from ray.serve.config import RequestRouterConfig

    config = RequestRouterConfig(request_router_class="tokenmold.service.fleet.router.ShapeAffinityRouter")
    check = (
        "import sys, cloudpickle; from tokenmold.service.fleet import known_replicas;"
        "cls = cloudpickle.loads(sys.stdin.buffer.read());"
        "print(cls.initialize_state.__globals__['known_replicas'] is known_replicas)"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", check], input=config._serialized_request_router_cls, capture_output=True, check=True
    )
    assert loaded.stdout.strip() == b"True"
