"""`--plot`: throughput and latency over time as a PNG (extra `plot`, matplotlib)."""

from __future__ import annotations

from pathlib import Path

from sim.errors import ConfigError
from sim.loadtest._stats import LoadTestResult

__all__ = ["require_matplotlib", "write_plot"]


def require_matplotlib() -> None:
    """Refuse `--plot` before the run, not after it, when the extra is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib, the 'plot' extra: pip install 'npcsim[plot]'") from exc


def write_plot(result: LoadTestResult, path: Path) -> None:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # no display: write a file only
    import matplotlib.pyplot as plt

    t = [p.t_s for p in result.timeline]
    fig, (rates, latency) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    try:
        rates.plot(t, [p.snapshots_per_s for p in result.timeline], label="snapshots/s (all)")
        rates.plot(t, [p.inferences_per_s for p in result.timeline], label="inferences/s")
        rates.set_ylabel("per second")
        rates.legend(loc="best")
        rates.set_title(f"npcsim loadtest: {result.agents} agents, violations {result.violations}")
        latency.plot(t, [p.build_p50_ms for p in result.timeline], label="build p50")
        latency.plot(t, [p.round_trip_p50_ms for p in result.timeline], label="round trip p50")
        latency.set_ylabel("ms")
        latency.set_xlabel("seconds into the run")
        latency.legend(loc="best")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
