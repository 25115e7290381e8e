"""The inference pool: requests, pool, backends, output handling, fallback, MQTT transport.

    async with open_pool(PoolConfig(backend="scripted", concurrency=8)) as pool:
        result = await pool.infer(request)      # never raises for a backend failure

The request and result types are wire types (`sim.wire.inference`), re-exported here.
Inside: the pool's slots (`_pool`) call one `Dispatch`, which answers with the fallback
when anything fails (`_dispatch`): serving on a backend here (`_serve`, judging each reply
with sim.output's `judge_reply`),
in a worker process of the pool's (`_local`, `_local_worker`), or the MQTT link (`_link`)
to remote workers (`_worker`), both batching (`_batch`); a working memory counted by a
server's tokenizer is built between fetches of its counts (`_counted`); the link holds remote replies to
the pool's checks (`_replies`); a re-execution serves each request on its record's
attempts (`open_pool(..., recorded=...)`). `_pool_config` and `_counters` hold the
configuration and the statistics; `backends` the backends. See docs/inference.md.
"""

from sim.inference._counted import KeptCounts, counted_memory
from sim.inference._counters import PoolStatistics
from sim.inference._dispatch import GENERIC_LINES, fallback_line
from sim.inference._pool import Pool, open_pool
from sim.inference._pool_config import PoolConfig, WorkerConfig
from sim.inference._replies import reply_problem
from sim.inference._worker import RemoteWorker
from sim.inference.backends import (
    BACKENDS,
    Backend,
    Reply,
    Tokenizer,
    check_context_window,
    check_reply_room,
    open_backend,
    open_tokenizer,
)
from sim.wire.inference import (
    InferenceRequest,
    InferenceResult,
    Priority,
    decode_request,
    decode_result,
    encode_request,
    encode_result,
)

__all__ = [
    "BACKENDS",
    "GENERIC_LINES",
    "Backend",
    "InferenceRequest",
    "InferenceResult",
    "KeptCounts",
    "Pool",
    "PoolConfig",
    "PoolStatistics",
    "Priority",
    "RemoteWorker",
    "Reply",
    "Tokenizer",
    "WorkerConfig",
    "check_context_window",
    "check_reply_room",
    "counted_memory",
    "open_tokenizer",
    "decode_request",
    "decode_result",
    "encode_request",
    "encode_result",
    "fallback_line",
    "open_backend",
    "open_pool",
    "reply_problem",
]
