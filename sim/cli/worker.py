"""`npcsim worker`: a remote inference worker; any number of them share one run's load."""

from __future__ import annotations

import argparse
import asyncio
import signal

from sim.cli._observe import add_metrics_argument, metrics_served
from sim.cli._options import (
    BACKEND_OPTIONS,
    TLS_FILES,
    add_backend_arguments,
    add_broker_arguments,
    add_set_argument,
    backend_options,
    broker_address,
    run_id,
    segment,
    settings_of,
    whole,
)
from sim.cli._terminal import Out
from sim.errors import NpcsimError
from sim.inference import RemoteWorker, WorkerConfig
from sim.mqtt import TlsFiles
from sim.protocol.seal import load_run_key
from sim.settings import with_settings
from sim.shard import InferenceConfig

__all__ = ["register", "worker_command"]

_FACT_GUARD = "inference.fact_guard"
_TIMEOUT = "inference.inference_timeout"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worker = subparsers.add_parser("worker", help="run a remote inference worker until SIGINT/SIGTERM")
    add_broker_arguments(worker, default=None, tls=False)
    worker.add_argument("--run", type=run_id, required=True, help="the run id whose requests to serve")
    add_backend_arguments(worker)
    worker.add_argument("--run-key-file", metavar="FILE", help="the run's key, when the run signs internal messages")
    worker.add_argument("--concurrency", type=whole(1), default=8, help="requests served at once (default 8)")
    worker.add_argument("--group", type=segment("worker group"), default="workers",
                        help="shared-subscription group (default 'workers')")
    worker.add_argument("--name", default="", help="the worker's MQTT client id (default: random)")
    add_set_argument(worker, "inference.backend_options.NAME, inference.fact_guard (the run's own: "
                     "docs/inference.md), inference.inference_timeout (seconds per request at the backend, "
                     "default 30) and broker.tls.ca_file, .cert_file, .key_file (mqtts://)")
    add_metrics_argument(worker)
    worker.set_defaults(func=worker_command)


async def _announce(worker: RemoteWorker, out: Out) -> None:
    await worker.ready.wait()
    out.record(f"worker {worker.name} ready: run {worker.config.run_id}, backend {worker.config.backend}, "
               f"concurrency {worker.config.concurrency}")


async def _run(worker: RemoteWorker, out: Out) -> None:
    """Serve until SIGINT or SIGTERM; then stop serving and return normally."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with asyncio.TaskGroup() as tg:
            serving = tg.create_task(worker.run())
            announcing = tg.create_task(_announce(worker, out))
            await stop.wait()
            serving.cancel()
            announcing.cancel()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def worker_command(args: argparse.Namespace) -> int:
    settings = settings_of(args.set, (BACKEND_OPTIONS, _FACT_GUARD, _TIMEOUT, TLS_FILES), "worker")
    serving = with_settings(InferenceConfig(), {k.removeprefix("inference."): v for k, v in settings.items()
                                                if k in (_FACT_GUARD, _TIMEOUT)}, "inference.")
    tls = with_settings(TlsFiles(), {k.removeprefix(TLS_FILES): v for k, v in settings.items()
                                     if k.startswith(TLS_FILES)}, TLS_FILES)
    config = WorkerConfig(
        broker=broker_address(args, tls), run_id=args.run,
        run_key=load_run_key(args.run_key_file) if args.run_key_file else None,
        backend=args.backend, options=backend_options(args, settings),
        concurrency=args.concurrency, group=args.group, timeout=serving.inference_timeout, name=args.name,
        fact_guard=serving.fact_guard,
    )
    worker = RemoteWorker(config)
    out = Out(flush=True)
    try:
        with metrics_served(args.metrics_port, out) as metrics:
            if metrics is not None:
                metrics.watch_pool(worker.statistics)
            asyncio.run(_run(worker, out))
    except ExceptionGroup as group:
        # A worker that cannot start (bad option, unknown backend) fails inside the task group.
        first = next((e for e in group.exceptions if isinstance(e, NpcsimError)), None)
        if first is None:
            raise
        raise first from group
    stats = worker.statistics()
    out.record(f"worker {worker.name} stopped: {stats.completed} served, fallbacks {stats.fallbacks}, "
               f"malformed {stats.malformed}")
    return 0
