"""PNG plots of runs (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def pyplot():
    """matplotlib's pyplot on the Agg backend, imported on first use: it costs about 0.4 s,
    which every ``phalanx`` command would otherwise pay before parsing its flags."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """Lay out, write and close a figure (an open figure per plot would leak memory)."""
    fig.tight_layout()
    fig.savefig(path)
    pyplot().close(fig)
    return path


def line_plot(path: Path, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
              xlabel: str, ylabel: str, title: str, logx: bool = False,
              logy: bool = False, markers: bool = True,
              reference: Sequence[str] = ()) -> Path:
    """One line per label: ``series[label] = (xs, ys)``. Labels in ``reference`` (formulas,
    claims) are drawn dashed without markers, so measured points on them stay visible."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for label, (xs, ys) in series.items():
        if label in reference:
            ax.plot(xs, ys, linestyle="--", linewidth=1.2, color="gray" if len(reference) == 1
                    else None, label=label)
        else:
            ax.plot(xs, ys, marker="o" if markers else None, markersize=6 if reference else 3,
                    linestyle=":" if reference else "-", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if series:
        ax.legend()
    return _save(fig, path)


def bar_plot(path: Path, values: Mapping[str, float], *, ylabel: str, title: str,
             xlabel: str = "") -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    labels = list(values)
    bars = ax.bar(labels, [values[k] for k in labels], color="tab:blue")
    ax.bar_label(bars, fmt="%.3g", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel or "strategy")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def histogram_plot(path: Path, hists: Mapping[str, Sequence[int]], *, xlabel: str, title: str
                   ) -> Path:
    """Grouped bars: ``hists[label][k]`` = count of value k (normalised to a fraction)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    labels = [k for k, h in hists.items() if sum(h)]
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        counts = hists[label]
        total = sum(counts)
        xs = [k + (i - (len(labels) - 1) / 2) * width for k in range(len(counts))]
        ax.bar(xs, [c / total for c in counts], width=width, label=label)
    longest = max((len(hists[k]) for k in labels), default=0)
    ax.set_xticks(range(longest) if longest <= 20 else range(0, longest, max(1, longest // 10)))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of applied updates")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    if labels:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no strategy here records staleness", ha="center",
                transform=ax.transAxes)
    return _save(fig, path)


def scatter_plot(path: Path, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
                 xlabel: str, ylabel: str, title: str, logx: bool = True,
                 frontier: Sequence[tuple[float, float]] = ()) -> Path:
    """One marker colour per label; ``frontier`` (x, y) points joined by a dashed line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.8, 4.6), dpi=110)
    for label, (xs, ys) in series.items():
        ax.scatter(xs, ys, s=28, label=label)
    if frontier:
        ax.plot([p[0] for p in frontier], [p[1] for p in frontier], linestyle="--",
                color="gray", linewidth=1.0, label="frontier")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if logx:
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=8)
    return _save(fig, path)


def band_plot(path: Path, series: Mapping[str, tuple[Sequence[float], Sequence[float],
                                                     Sequence[float], Sequence[float]]], *,
              xlabel: str, ylabel: str, title: str, logx: bool = False) -> Path:
    """Mean curves with a shaded band: ``series[label] = (xs, mean, low, high)`` (repeated
    seeds; a band of zero width, from one seed, draws as the plain line)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for label, (xs, mean, low, high) in series.items():
        (line,) = ax.plot(xs, mean, marker="o", markersize=3, label=label)
        if any(hi > lo for lo, hi in zip(low, high)):
            ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if series:
        ax.legend()
    return _save(fig, path)
