"""Batch runs over the fleet with Ray Data: ``verdicts(dataset)`` for a Ray Dataset of OpenAI batch
request lines, and ``tokenmold ray batch`` on a file, both answered by the fleet's replicas.

Ray Data streams the rows through a pool of actors that send each line to the replicas through Ray
Serve's handle (the shape-affinity router picks the replica), so a file of any length is spread
over every replica while interactive requests share them. The command writes the result file from
one process, the driver, through the same append-only ``ResultFile`` as ``tokenmold batch``: a line
is written once, when its answer is in, and a rerun skips the ids already there, so a run killed at
any point (the driver or a replica) resumes with no line lost or written twice.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

from tokenmold.service.batch.dispatch import Outcome
from tokenmold.service.batch.jobs import Job, read_requests
from tokenmold.service.batch.results import OpenAIFormat
from tokenmold.service.fleet.batch_lines import BatchLine, LineAnswer
from tokenmold.service.fleet.cli import APP_NAME

#: The replicas' deployment, as Ray Serve names it in the application.
DEPLOYMENT = "EngineReplica"

#: Tries of a line whose replica died under it (Ray Serve routes the next try to a live one).
_TRIES = 4
_LINES_A_REPLICA = 32


class _FleetCaller:
    """A Ray Data actor: sends each row of a batch to the replicas and waits for all of them."""

    def __init__(self, app_name: str) -> None:
        from ray import serve

        self._replicas = serve.get_deployment_handle(DEPLOYMENT, app_name)

    def __call__(self, rows: dict[str, Any]) -> dict[str, list[Any]]:
        jobs = [
            Job(line=int(line), custom_id=str(custom_id), url=str(url), body=_body(body))
            for line, custom_id, url, body in zip(
                rows["line"], rows["custom_id"], rows["url"], rows["body"], strict=True
            )
        ]
        answers = self._answers(jobs)
        fmt = OpenAIFormat()
        outcomes = [Outcome(job, answer.status_code, answer.body) for job, answer in zip(jobs, answers, strict=True)]
        return {
            "line": [job.line for job in jobs],
            "custom_id": [job.custom_id for job in jobs],
            "status_code": [answer.status_code for answer in answers],
            "response": [json.dumps(answer.body) for answer in answers],
            "result_line": [json.dumps(fmt.outcome(outcome)) for outcome in outcomes],
            "server_error": [outcome.server_error for outcome in outcomes],
            "replica": [answer.replica for answer in answers],
        }

    def _answers(self, jobs: list[Job]) -> list[LineAnswer]:
        """Every job's answer; one whose replica died is sent again, after a pause that lets Ray
        Serve notice, up to ``_TRIES`` times; then it is a 503, left for a rerun."""
        import ray

        answers: dict[int, LineAnswer] = {}
        waiting = list(range(len(jobs)))
        for attempt in range(_TRIES):
            calls = {index: self._replicas.execute.remote(BatchLine(jobs[index])) for index in waiting}
            waiting = []
            for index, call in calls.items():
                try:
                    answers[index] = call.result()
                except ray.exceptions.RayError:
                    waiting.append(index)
            if not waiting:
                break
            time.sleep(2**attempt)
        for index in waiting:
            error = {"message": "no replica could answer this line", "type": "server_error", "code": "replica_failed"}
            answers[index] = LineAnswer(503, {"error": error}, "")
        return [answers[index] for index in range(len(jobs))]


def _body(value: Any) -> dict[str, Any]:
    body = json.loads(value) if isinstance(value, str) else dict(value)
    if not isinstance(body, dict):
        raise ValueError("a batch line's body must be a JSON object")
    return body


def verdicts(dataset: Any, *, app_name: str = APP_NAME, actors: int = 1, lines_per_call: int = _LINES_A_REPLICA) -> Any:
    """The fleet's answers to a Ray Dataset of OpenAI batch request lines, as a Ray Dataset.

    Each input row has ``custom_id``, ``url`` (``/v1/chat/completions``, ``/v1/completions`` or
    ``/v1/responses``), ``body`` (the request, as JSON text: Arrow would merge the keys of every
    row's schema into every other's) and ``line`` (its number, for messages). Each output row has
    ``custom_id``, ``line``, ``status_code``, ``response`` (the route's JSON body as text, with its
    ``tokenmold`` verdicts), ``result_line`` (the line ``tokenmold batch`` writes, as text),
    ``server_error`` (a failure worth retrying) and ``replica``. The application ``app_name``
    (``tokenmold ray serve``, or ``deploy_replicas``) must be running; ``actors`` callers keep
    ``lines_per_call`` lines each in flight."""
    import ray

    return dataset.map_batches(
        _FleetCaller,
        fn_constructor_kwargs={"app_name": app_name},
        batch_size=lines_per_call,
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=0,
        batch_format="numpy",
    )


def fleet_running(app_name: str = APP_NAME) -> bool:
    """Whether an application ``app_name`` runs in the connected cluster (a ``tokenmold ray
    serve``, whose replicas a batch then shares)."""
    from ray import serve

    return serve.status().applications.get(app_name) is not None


def deploy_replicas(options: Any, app_name: str = APP_NAME) -> None:
    """Start the fleet's replicas as ``app_name``, without an HTTP route (delete them with
    ``serve.delete(app_name)``)."""
    from ray import serve

    from tokenmold.service.fleet.deployments import replica_deployment

    serve.start(http_options={"location": "NoServer"})
    serve.run(replica_deployment(options), name=app_name, route_prefix=None, blocking=False)


def run_batch_command(args: argparse.Namespace) -> int:
    """``tokenmold ray batch``: the exit codes of ``tokenmold batch``."""
    from tokenmold.service.batch.cli import ResultSink, _lines, run_lines
    from tokenmold.service.fleet.cli import check_counts

    check_counts(args)
    batch = read_requests(_lines(args.input))

    def execute(todo: list[Job], sink: ResultSink) -> bool:
        import ray
        from ray import serve

        from tokenmold.service.fleet.cli import connect, fleet_options

        connect(args)
        if not (args.log_level or args.verbose):  # the command's own progress line says it
            ray.data.DataContext.get_current().enable_progress_bars = False
            logging.getLogger("ray.data").setLevel(logging.ERROR)
        deployed = not fleet_running(args.app_name)
        if deployed:  # else the batch shares the running application's replicas
            deploy_replicas(fleet_options(args), args.app_name)
        try:
            sink.engines_started()
            jobs = {job.custom_id: job for job in todo}
            rows = [
                {"line": job.line, "custom_id": job.custom_id, "url": job.url, "body": json.dumps(job.body)}
                for job in todo
            ]
            per_call = max(1, (args.concurrency or _LINES_A_REPLICA * args.replicas) // args.replicas)
            dataset = ray.data.from_items(rows, override_num_blocks=max(1, len(rows) // per_call))
            answered = verdicts(dataset, app_name=args.app_name, actors=args.replicas, lines_per_call=per_call)
            for row in answered.iter_rows():
                sink.record(Outcome(jobs[str(row["custom_id"])], int(row["status_code"]), json.loads(row["response"])))
            return True
        finally:
            if deployed:
                serve.delete(args.app_name)

    return run_lines(args.input, args.output, batch, OpenAIFormat(), execute)
