"""``simulate --plot FILE``: per-share usage over time for each configuration (one panel each, stacked
areas against the pool's capacity), and the wait-time distribution of every share in every
configuration (cumulative, log scale). PNG or SVG, by the file's suffix (matplotlib, Agg backend)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gpuquota.ctl.api import CliError
from gpuquota.sim.engine import Result

FORMATS = (".png", ".svg")


NEEDS_PLOTS = "simulate --plot needs matplotlib: pip install 'gpuquota[plots]'"


def check_target(path: str) -> None:
    """Fail before the simulation runs: a bad suffix, or matplotlib missing (plotting is an extra)."""
    if Path(path).suffix.lower() not in FORMATS:
        raise CliError(f"--plot {path}: the file must end in .png or .svg")
    if importlib.util.find_spec("matplotlib") is None:
        raise CliError(NEEDS_PLOTS)


def draw(results: list[Result], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(results) + 1
    figure, axes = plt.subplots(rows, 1, figsize=(10, 2.8 * rows), squeeze=False)
    for ax, result in zip(axes[:, 0], results, strict=False):
        hours = [(t - result.start_ms) / 3_600_000 for t in result.samples.times]
        series = list(zip(*result.samples.values, strict=True)) if result.samples.values else []
        if series:
            ax.stackplot(hours, *series, labels=result.shares, step="post", alpha=0.85)
        ax.axhline(result.capacity, color="black", linewidth=0.8, linestyle="--", label="capacity")
        ax.set_title(f"{result.name}: usage per share")
        ax.set_xlabel("hours")
        ax.set_ylabel("instances")
        ax.legend(loc="upper right", fontsize="small", ncol=min(6, len(result.shares) + 1))
    waits = axes[-1, 0]
    for number, result in enumerate(results):
        style = ("-", "--", ":", "-.")[number % 4]  # one line style per configuration, one colour per share
        for name, counters in zip(result.shares, result.counters, strict=True):
            points = counters.waits.points()
            if not points:
                continue
            total = counters.waits.total
            cumulative, xs, ys = 0, [], []
            for edge, count in points:
                cumulative += count
                xs.append(max(edge, 1.0))
                ys.append(cumulative / total)
            colour = f"C{result.shares.index(name) % 10}"
            waits.step(xs, ys, where="post", color=colour, linestyle=style, label=f"{result.name} {name}")
    waits.set_xscale("log")
    waits.set_title("wait before the first start (cumulative share of jobs)")
    waits.set_xlabel("seconds (waits under 1 s drawn at 1 s)")
    waits.set_ylim(0, 1.02)
    waits.legend(loc="lower right", fontsize="small", ncol=2)
    figure.tight_layout()
    figure.savefig(path, metadata={"Date": None} if path.lower().endswith(".svg") else None)
    plt.close(figure)
