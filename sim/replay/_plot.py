"""`npcsim replay --set ... --plot FILE`: what each variant cut, as the load test draws it (extra `plot`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sim.replay._whatif import CATEGORIES, Tally

__all__ = ["write_plot"]


def write_plot(tallies: Sequence[Tally], path: Path) -> None:
    """Items lost and gained per inference by category (one bar per variant), and prompt sizes."""
    from sim.loadtest import require_matplotlib  # here: the load test's package is not needed otherwise

    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # no display: write a file only
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(11, 6.4))
    try:
        grid = fig.add_gridspec(2, 2)
        width = 0.8 / max(len(tallies), 1)
        for column, (field, title) in enumerate((("lost", "items lost per inference"),
                                                 ("gained", "items gained per inference"))):
            axes = fig.add_subplot(grid[0, column])
            for j, tally in enumerate(tallies):
                counts = getattr(tally, field)
                values = [counts[c] / max(tally.inferences, 1) for c in CATEGORIES]
                offset = (j - (len(tallies) - 1) / 2) * width
                axes.bar([i + offset for i in range(len(CATEGORIES))], values, width, label=tally.label)
            axes.set_xticks(range(len(CATEGORIES)), list(CATEGORIES), fontsize=8)
            axes.set_title(title, fontsize=10)
            axes.legend(loc="best", fontsize=7)
        sizes = fig.add_subplot(grid[1, :])
        labels = [t.label for t in tallies]
        sizes.bar(labels, [t.chars / max(t.inferences, 1) for t in tallies], label="mean prompt chars")
        if tallies:
            sizes.axhline(tallies[0].recorded_chars / max(tallies[0].inferences, 1), color="grey", linestyle=":",
                          label="recorded mean")
        sizes.set_ylabel("characters")
        sizes.set_title("prompt size; over budget: " + ", ".join(f"{t.over_budget}" for t in tallies), fontsize=10)
        sizes.legend(loc="best", fontsize=8)
        fig.suptitle(f"npcsim replay what-if: {tallies[0].inferences if tallies else 0:,} inferences per variant")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
