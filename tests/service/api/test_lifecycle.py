"""The server's lifecycle without an engine: the gate refuses while draining or failed, and the
exit decision. The same behaviour on a live server is tested in ``tests/test_faults.py``."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from tokenmold.service.api.lifecycle import Gate, Lifecycle


def _app(lifecycle: Lifecycle) -> FastAPI:
    app = FastAPI()

    @app.get("/work")
    def work() -> dict[str, int]:
        return {"in_flight": lifecycle.in_flight}

    app.add_middleware(Gate, lifecycle=lifecycle)
    return app


def test_serving_counts_requests_in_flight() -> None:
    lifecycle = Lifecycle()
    response = TestClient(_app(lifecycle)).get("/work")
    assert response.json() == {"in_flight": 1}
    assert lifecycle.in_flight == 0 and not lifecycle.should_exit()


def test_draining_refuses_new_requests_and_exits_0_when_idle() -> None:
    lifecycle = Lifecycle(grace_s=30)
    lifecycle.drain()
    response = TestClient(_app(lifecycle)).get("/work")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "shutting_down"
    assert response.headers["connection"] == "close"
    assert lifecycle.should_exit() and lifecycle.exit_code == 0


def test_draining_waits_for_requests_in_flight_up_to_the_grace() -> None:
    lifecycle = Lifecycle(grace_s=0.0)
    lifecycle.in_flight = 1
    lifecycle.drain()
    assert lifecycle.should_exit()  # grace spent
    patient = Lifecycle(grace_s=3600)
    patient.in_flight = 1
    patient.drain()
    assert not patient.should_exit()


def test_a_failed_engine_is_503_and_exit_status_1() -> None:
    lifecycle = Lifecycle()
    lifecycle.fail("the engine process died")
    response = TestClient(_app(lifecycle)).get("/work")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "engine_unavailable"
    assert lifecycle.should_exit() and lifecycle.exit_code == 1
