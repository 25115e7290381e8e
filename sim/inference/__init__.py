"""The inference pool: requests, pool, backends, output handling, fallback, MQTT transport.

    async with open_pool(PoolConfig(backend="scripted", concurrency=8)) as pool:
        result = await pool.infer(request)      # never raises for a backend failure

See docs/inference.md.
"""

from sim.inference._fallback import GENERIC_LINES, fallback_line
from sim.inference._mqtt import RemoteWorker
from sim.inference._output import Verdict, clean_line, contradicted_fact, judge
from sim.inference._pool import Pool, open_pool
from sim.inference._replies import reply_problem
from sim.inference._types import (
    InferenceRequest,
    InferenceResult,
    PoolConfig,
    PoolStatistics,
    Priority,
    Reply,
    WorkerConfig,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)
from sim.inference.backends import BACKENDS, Backend, open_backend

__all__ = [
    "BACKENDS",
    "GENERIC_LINES",
    "Backend",
    "InferenceRequest",
    "InferenceResult",
    "Pool",
    "PoolConfig",
    "PoolStatistics",
    "Priority",
    "RemoteWorker",
    "Reply",
    "Verdict",
    "WorkerConfig",
    "clean_line",
    "contradicted_fact",
    "decode_request",
    "decode_result",
    "encode_request",
    "encode_result",
    "fallback_line",
    "judge",
    "open_backend",
    "open_pool",
    "reply_problem",
]
