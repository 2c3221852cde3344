"""A grouped bar chart of median ms per shape and candidate (log scale), min-max as error bars.
matplotlib is imported here only, when a plot is asked for (pip install 'kdactl[bench]')."""

from __future__ import annotations

from pathlib import Path

from kdactl.bench.model import ShapeRun
from kdactl.errors import UsageError


def plot_runs(runs: list[ShapeRun], names: list[str], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib (pip install 'kdactl[bench]')") from None
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(runs)), 4.5))
    for j, name in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for i, r in enumerate(runs):
            o = r.outcome(name)
            if o is None or o.summary is None or r.median(name) is None:
                continue
            s = o.summary
            xs.append(i + (j - (len(names) - 1) / 2) * width)
            ys.append(s.median_ms)
            lo.append(s.median_ms - s.min_ms)
            hi.append(s.max_ms - s.median_ms)
        if xs:
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=name)
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels([r.shape.key for r in runs], rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("median ms (min-max bars)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
