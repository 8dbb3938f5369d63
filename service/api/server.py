"""``tokenmold serve``: build the runtime from the command line and run the app under uvicorn."""

from __future__ import annotations

import argparse
from pathlib import Path

from grammar import Limits
from service.engine import EngineConfig
from service.runtime import Runtime, RuntimeConfig


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.api.app import create_app
    from service.api.settings import ServerSettings

    runtime = Runtime(RuntimeConfig(
        engine=EngineConfig(
            model=args.model,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            tensor_parallel_size=args.tensor_parallel_size,
            data_parallel_size=args.data_parallel_size,
            reasoning_parser=args.reasoning_parser,
        ),
        limits=Limits(compile_timeout_s=args.compile_timeout),
        compile_workers=args.compile_workers,
        jump_forward=args.jump_forward,
    ))
    settings = ServerSettings(
        model_name=args.served_model_name or Path(runtime.model.path).name,
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        reject_unaccepted=args.reject_unaccepted,
    )
    try:
        # A bounded graceful shutdown: open keep-alive or streaming connections must not keep a
        # stopped server (and its engine) alive.
        uvicorn.run(create_app(runtime, settings), host=args.host, port=args.port, log_level=args.log_level,
                    timeout_graceful_shutdown=10)
    finally:
        runtime.shutdown()  # also when uvicorn fails before the app's own shutdown (port taken)
    return 0
