"""How many processes a vLLM engine on CPU takes: two (engine core with its worker inside), not three.

vLLM's CPU platform turns the single-process executor (``uni``) into the multi-process one
(``mp``) whenever the engine core runs in its own process (``platforms/cpu.py``: "OMP requires the
MP executor ... it is not possible to set the OMP environment correctly"), so one engine on one
CPU socket is an API process, an engine core and a worker, each spawned afresh and each importing
vLLM (seconds of CPU apiece). The reason is the OpenMP environment: vLLM sets
``OMP_NUM_THREADS`` and the thread binding (``OMPProcessManager.configure_omp_envs``) in the
environment of the worker it spawns, since the OpenMP runtime reads them once, when it loads.

The engine core is spawned too, so it can carry that environment just as well: here the API
process sets it around the engine core's start, with vLLM's own ``OMPProcessManager``, and asks for
the ``uni`` executor, which builds the worker inside the engine core. The model then runs in the
process that schedules it: one vLLM import and one process's memory fewer per engine start, and no
inter-process hop per step. On a 2-core host a start costs much less CPU and answers sooner, and
concurrent JSON requests decode faster (the engine core's busy loop no longer contends with the
worker's threads; measured: docs/operations.md, "vLLM's engine arguments"). What it gives
up: the engine core fills the next step's grammar masks while the model runs only when the worker
is a process of its own, which a many-core host with large batches may prefer: a
``--distributed-executor-backend`` given on the command line is kept as it is. Engines spread over
several workers (tensor, pipeline or data parallel) and other platforms are left as vLLM sets
them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config import VllmConfig


def worker_can_share_the_engine_core(vllm_config: VllmConfig, *, executor_given: bool = False) -> bool:
    """One CPU worker in all, the engine core in a process of its own, no executor asked for: the
    case vLLM's CPU platform turns into the multi-process executor although one process would do."""
    from vllm.platforms import current_platform

    parallel = vllm_config.parallel_config
    return (
        not executor_given
        and current_platform.is_cpu()
        and parallel.world_size == 1
        and parallel.data_parallel_size == 1
        and parallel.distributed_executor_backend == "mp"
    )


@contextmanager
def worker_in_engine_core(vllm_config: VllmConfig, *, executor_given: bool = False) -> Iterator[None]:
    """Around the engine's start (``AsyncLLM(...)``, which spawns the engine core): where one worker
    would be spawned beside the engine core, run it inside, with the OpenMP environment vLLM gives
    its worker set while the engine core starts; elsewhere, nothing changes. ``executor_given``:
    the user chose vLLM's ``distributed_executor_backend``, which is then kept."""
    if not worker_can_share_the_engine_core(vllm_config, executor_given=executor_given):
        yield
        return
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    vllm_config.parallel_config.distributed_executor_backend = "uni"
    with OMPProcessManager(vllm_config).configure_omp_envs(rank=0, local_rank=0):
        yield
