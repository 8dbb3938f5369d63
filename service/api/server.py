"""``tokenmold serve``: build the runtime from the command line and run the app under uvicorn.

The uvicorn server is wrapped so that SIGTERM drains (``lifecycle.py``) instead of stopping at once,
and so that a dead engine process stops the server with exit status 1. The listening socket is bound
before the engine starts (as vLLM's own API server does): the engine and its workers open ephemeral
ports of their own while they start, and one of them could otherwise take the port meanwhile.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI

from tokenmold.grammar import Limits
from tokenmold.service.api.lifecycle import Lifecycle
from tokenmold.service.errors import BadInput
from tokenmold.service.request.runtime import Runtime, RuntimeConfig


class _Server(uvicorn.Server):
    """uvicorn's server, checking the lifecycle on each tick of its main loop (every 0.1 s)."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, engine_dead: Callable[[], bool]) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.engine_dead = engine_dead

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The first SIGTERM/SIGINT drains; a second one stops now (uvicorn's own handling)."""
        if self.lifecycle.refusing:
            super().handle_exit(sig, frame)
        else:
            logging.getLogger("uvicorn.error").warning(
                "draining: new requests get 503; up to %g s for %d in flight",
                self.lifecycle.grace_s,
                self.lifecycle.in_flight,
            )
            self.lifecycle.drain()

    async def on_tick(self, counter: int) -> bool:
        if self.lifecycle.failure is None and self.engine_dead():
            logging.getLogger("uvicorn.error").error("the engine process died; stopping (exit status 1)")
            self.lifecycle.fail("the engine process died")
        if self.lifecycle.should_exit():
            self.should_exit = True
        return await super().on_tick(counter)


#: The start of the error ``serve`` exits with when its port is taken (test harnesses retry on it).
PORT_TAKEN = "cannot listen on"


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound now; a port already taken is the caller's error (exit status 2)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise BadInput(f"{PORT_TAKEN} {host}:{port}: {exc.strerror}") from None
    return sock


@dataclass(frozen=True)
class ServerParts:
    """What a ``serve`` command line builds: the runtime, its app and the app's lifecycle."""

    runtime: Runtime
    app: FastAPI
    lifecycle: Lifecycle


def build_server(args: argparse.Namespace) -> ServerParts:
    """The runtime and app of a parsed ``serve`` command line, engine not started yet (the app's
    lifespan starts it). ``tokenmold serve`` runs it under uvicorn; each replica of ``tokenmold ray
    serve`` runs the same under Ray Serve."""
    from tokenmold.service.api.app import create_app
    from tokenmold.service.api.settings import ServerSettings
    from tokenmold.service.cli.main import engine_config
    from tokenmold.service.store.responses import StoreBounds

    engine = engine_config(args, reasoning_parser=args.reasoning_parser, forced_drafts=args.forced_drafts)
    runtime = Runtime(
        RuntimeConfig(
            engine=engine,
            limits=Limits(compile_timeout_s=args.compile_timeout),
            compile_workers=args.compile_workers,
            compile_queue_timeout_s=args.compile_queue_timeout,
            jump_forward=args.jump_forward,
            tool_call_format=args.tool_call_format,
            chat_template=args.chat_template,
            repetition_guard=args.repetition_guard,
            repeated_call_guard=args.repeated_call_guard,
            guards=args.guards,
            budget_floor=args.budget_floor,
        )
    )
    if runtime.reasoning is not None and runtime.reasoning.note:
        print(f"tokenmold: note: {runtime.reasoning.note}", file=sys.stderr)
    # Each name once, in the order given (vLLM's flag takes several; the first names the answers).
    names = list(dict.fromkeys(args.served_model_name or [Path(runtime.model.path).name]))
    settings = ServerSettings(
        model_name=names[0],
        model_aliases=tuple(names[1:]),
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        reject_unaccepted=args.reject_unaccepted,
        batch_dir=args.batch_dir,
        max_file_bytes=args.max_file_bytes,
        trust_request_chat_template=args.trust_request_chat_template,
        store=args.store,
        store_dir=args.store_dir,
        store_bounds=StoreBounds(ttl_s=args.store_ttl, max_bytes=int(args.store_max_mb * (1 << 20))),
    )
    lifecycle = Lifecycle(grace_s=args.shutdown_grace)
    return ServerParts(runtime, create_app(runtime, settings, lifecycle), lifecycle)


def serve(args: argparse.Namespace) -> int:
    if args.enable_auto_tool_choice:
        print(
            "tokenmold: note: --enable-auto-tool-choice is not needed: tool_choice 'auto' is served without it",
            file=sys.stderr,
        )
    sock = listen(args.host, args.port)
    try:
        parts = build_server(args)
    except BaseException:
        sock.close()
        raise
    config = uvicorn.Config(
        parts.app,
        host=args.host,
        port=args.port,
        log_level=args.log_level or "info",  # its startup and access lines stay by default
        # After the drain: open keep-alive or streaming connections must not keep a stopped
        # server (and its engine) alive.
        timeout_graceful_shutdown=10,
    )
    try:
        _Server(config, parts.lifecycle, lambda: parts.runtime.engine_dead).run(sockets=[sock])
    finally:
        parts.runtime.shutdown()  # also when uvicorn fails before the app's own shutdown
        sock.close()
    return parts.lifecycle.exit_code
