"""``tokenmold ray serve`` and ``tokenmold ray batch``: the fleet from the command line.

    tokenmold ray serve --replicas N [--address ADDR] [--no-affinity] [--min-replicas A --max-replicas B]
                        [every ``tokenmold serve`` flag and vLLM engine argument]
    tokenmold ray batch -i IN.jsonl -o OUT.jsonl --replicas N [--address ADDR] [serve flags...]

With no ``--address`` a local Ray cluster starts with the command and stops with it; with one (or
``RAY_ADDRESS``), the command joins that cluster. Both stay in the foreground: ``serve`` until
SIGINT or SIGTERM, when it deletes its application; ``batch`` until every line has its result.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from tokenmold.service.errors import BadInput

#: The Ray Serve application's default name (several fleets can share a cluster under other names).
APP_NAME = "tokenmold"


def add_commands(sub: Any, serve_flags: Any) -> None:
    """Register ``ray serve`` and ``ray batch`` on the ``tokenmold`` parser's subcommands;
    ``serve_flags`` adds ``tokenmold serve``'s own flags to a parser."""
    ray_parser = sub.add_parser("ray", help="the app on several replicas under Ray Serve; batch over them")
    commands = ray_parser.add_subparsers(dest="ray_command", required=True, parser_class=type(ray_parser))

    # The flags functions set ``func`` last: the parser is built again with vLLM's engine arguments
    # (``EngineArgParser``), and ``serve_flags`` sets its own.
    def serve_with_fleet_flags(parser: argparse.ArgumentParser) -> None:
        serve_flags(parser)
        _fleet_flags(parser)
        parser.set_defaults(func=_serve)

    commands.add_parser("serve", help="the OpenAI app on N replicas", flags=serve_with_fleet_flags)

    def batch_flags(parser: argparse.ArgumentParser) -> None:
        serve_flags(parser)
        _fleet_flags(parser)
        parser.add_argument("-i", "--input", required=True, metavar="FILE", help="OpenAI batch input lines")
        parser.add_argument(
            "-o", "--output", required=True, metavar="FILE", help="result lines; appended to, ids already there skipped"
        )
        parser.add_argument(
            "--concurrency", type=int, default=None, help="lines in flight across the fleet (default: 32 a replica)"
        )
        parser.set_defaults(func=_batch)

    commands.add_parser("batch", help="an OpenAI batch file over N replicas (resumable)", flags=batch_flags)


def _fleet_flags(parser: argparse.ArgumentParser) -> None:
    fleet = parser.add_argument_group("fleet (Ray)")
    fleet.add_argument("--replicas", type=int, default=1, help="engine replicas (the initial count when autoscaling)")
    fleet.add_argument("--min-replicas", type=int, default=None, help="autoscaling's lower bound (Ray Serve)")
    fleet.add_argument("--max-replicas", type=int, default=None, help="autoscaling's upper bound (Ray Serve)")
    fleet.add_argument(
        "--address",
        default=None,
        help="the Ray cluster to join (default: $RAY_ADDRESS, else a local cluster started for this command)",
    )
    fleet.add_argument(
        "--no-affinity",
        dest="affinity",
        action="store_false",
        help="route by load alone, not by shape (default: a shape's requests go to the replica that has it warm)",
    )
    fleet.add_argument("--cpus-per-replica", type=float, default=1.0, help="Ray CPUs each replica reserves")
    fleet.add_argument(
        "--gpus-per-replica",
        type=float,
        default=None,
        help="Ray GPUs each replica reserves (default: tensor x pipeline parallel size where the cluster has GPUs,"
        " else 0)",
    )
    fleet.add_argument("--app-name", default=APP_NAME, help="the Ray Serve application's name")


def check_counts(args: argparse.Namespace) -> None:
    """The replica counts a command line gives, refused before any cluster starts."""
    if args.replicas < 1:
        raise BadInput("--replicas must be at least 1")
    low = args.min_replicas if args.min_replicas is not None else 1
    high = args.max_replicas if args.max_replicas is not None else args.replicas
    if (args.min_replicas is not None or args.max_replicas is not None) and not 0 <= low <= args.replicas <= high:
        raise BadInput(
            f"autoscaling needs --min-replicas <= --replicas <= --max-replicas (got {low}, {args.replicas}, {high})"
        )


def fleet_options(args: argparse.Namespace) -> Any:  # -> deployments.FleetOptions
    """The fleet a parsed ``ray serve``/``ray batch`` command line asks for (Ray connected)."""
    import ray

    from tokenmold.service.cli.main import engine_config
    from tokenmold.service.fleet.deployments import FleetOptions, passed_on_environment

    engine = engine_config(args, reasoning_parser=args.reasoning_parser, forced_drafts=args.forced_drafts)
    gpus = args.gpus_per_replica
    if gpus is None:
        parallel = int(engine.engine_args.get("tensor_parallel_size") or 1) * int(
            engine.engine_args.get("pipeline_parallel_size") or 1
        )
        gpus = float(parallel) if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    serve_args = {name: value for name, value in vars(args).items() if name != "func"}
    return FleetOptions(
        serve_args=serve_args,
        replicas=args.replicas,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        affinity=args.affinity,
        cpus_per_replica=args.cpus_per_replica,
        gpus_per_replica=gpus,
        max_ongoing_requests=2 * engine.max_num_seqs,
        environment=passed_on_environment(),
    )


def connect(args: argparse.Namespace) -> str:
    """Join ``--address`` (or ``RAY_ADDRESS``), or start a local cluster; returns the cluster's
    address (what ``--address`` of another command takes). Ray's own logs and the replicas' stay in
    Ray's log folder unless ``--log-level``/``--verbose`` asks for them here."""
    import ray

    verbose = bool(args.log_level or args.verbose)
    try:
        ray.init(
            address=args.address,
            namespace="tokenmold",
            include_dashboard=False,
            log_to_driver=verbose,
            logging_level=logging.INFO if verbose else logging.ERROR,
            configure_logging=True,
        )
    except ConnectionError as exc:
        hint = ""
        if not os.environ.get("RAY_AUTH_MODE"):
            # Ray sends its token to an address given explicitly only when told to.
            hint = " (a cluster with token authentication, Ray's default, needs RAY_AUTH_MODE=token here)"
        raise BadInput(f"cannot join the Ray cluster at {args.address}: {exc}{hint}") from None
    return str(ray.get_runtime_context().gcs_address)


def _serve(args: argparse.Namespace) -> int:
    from ray import serve

    from tokenmold.service.api.server import listen
    from tokenmold.service.fleet.deployments import fleet_application

    check_counts(args)
    listen(args.host, args.port).close()  # a port already taken is the caller's error, before any replica starts
    address = connect(args)
    options = fleet_options(args)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(fleet_application(options), name=args.app_name, route_prefix="/", blocking=False)
    print(
        f"tokenmold: serving on http://{args.host}:{args.port} with {options.replicas} replica(s)"
        f" (affinity {'on' if options.affinity else 'off'}); Ray cluster at {address}",
        file=sys.stderr,
        flush=True,
    )
    _wait_for_a_signal()
    if joined(args):
        serve.delete(args.app_name)  # the cluster is someone else's: leave it running
    else:
        serve.shutdown()  # every replica drains and stops its engine; the local cluster stops at exit
    return 0


def joined(args: argparse.Namespace) -> bool:
    """Whether the command joined an existing cluster (rather than starting its own)."""
    return bool(args.address or os.environ.get("RAY_ADDRESS"))


def _wait_for_a_signal() -> None:
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)
    stop.wait()


def _batch(args: argparse.Namespace) -> int:
    from tokenmold.service.fleet.batch import run_batch_command

    return run_batch_command(args)
