"""PNG pictures of benchmark results, saved beside their JSON.

A benchmark prints a table, writes a JSON (``_common.write_json``) and, through this
module, a PNG with the same name: ``bench_results/e2e-20260101-120000.json`` gets
``bench_results/e2e-20260101-120000.png``. Two shapes cover the benchmarks:

* ``save_bar_chart``: one metric per configuration (samples/s per mode, lookups/s per
  engine); several series give grouped bars; a baseline draws a dashed line.
* ``save_line_chart``: a curve (a metric against steps, batch size, threads).

``bar_chart_from_rows`` takes the same row dicts a benchmark hands to ``print_table``.

matplotlib is the ``bench`` extra (``pip install -e '.[bench]'``; ``make venv`` installs
it). It is imported lazily, with the non-interactive Agg backend, so a benchmark run on a
machine without a display (or without matplotlib: the ``save_*`` functions then print one
line saying so and return ``None``) still prints its table and JSON.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

INSTALL_HINT = "pip install -e '.[bench]'"


def png_beside(json_path: str | Path) -> Path:
    """The PNG path that goes with a benchmark's JSON: same folder and stem, ``.png``."""
    return Path(json_path).with_suffix(".png")


def _pyplot() -> Any | None:
    """matplotlib.pyplot on the Agg backend, or None (with a note on stderr) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        print(f"no PNG written: matplotlib is not installed ({INSTALL_HINT})", file=sys.stderr)
        return None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else None (a '-' cell, a missing run)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _fmt(value: float) -> str:
    """A bar's label: 2.50M, 25.0k, 2500, 0.853."""
    if abs(value) >= 1e6:
        return f"{value / 1e6:.2f}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.1f}k"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _save(fig: Any, plt: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_bar_chart(
    path: str | Path,
    labels: Sequence[str],
    values: Sequence[float | None] | Mapping[str, Sequence[float | None]],
    *,
    title: str,
    ylabel: str,
    baseline: float | None = None,
    baseline_label: str = "baseline",
    logy: bool = False,
) -> Path | None:
    """Save a bar chart of one metric per configuration as a PNG; the path written.

    ``labels`` name the configurations (x axis). ``values`` is one number per label, or
    ``{series: numbers per label}`` for grouped bars (e.g. median and best per mode). A
    value that is None or not finite leaves its bar out. Each bar carries its value.
    ``baseline`` draws a dashed horizontal line (the reference the ratios are against).
    ``logy``: a log scale, for values orders of magnitude apart. A ``.json`` path is replaced by the PNG beside it.
    """
    series = dict(values) if isinstance(values, Mapping) else {"": list(values)}
    for name, vals in series.items():
        if len(vals) != len(labels):
            raise ValueError(
                f"save_bar_chart: series {name!r} has {len(vals)} values for "
                f"{len(labels)} labels; expected one value per label"
            )
    plt = _pyplot()
    if plt is None:
        return None
    out = png_beside(path) if Path(path).suffix == ".json" else Path(path)
    n_series = len(series)
    width = 0.8 / n_series
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(labels) * max(1, n_series * 0.6) + 2), 3.8))
    for i, (name, vals) in enumerate(series.items()):
        xs, ys = [], []
        for j, v in enumerate(vals):
            f = _finite(v)
            if f is not None:
                xs.append(j + (i - (n_series - 1) / 2) * width)
                ys.append(f)
        bars = ax.bar(xs, ys, width=width, label=name or None)
        ax.bar_label(bars, labels=[_fmt(y) for y in ys], fontsize=8, padding=2)
    if baseline is not None and _finite(baseline) is not None:
        ax.axhline(float(baseline), color="0.3", linestyle="--", linewidth=1, label=baseline_label)
    ax.set_xticks(
        range(len(labels)), [str(lb) for lb in labels], rotation=20 if len(labels) > 4 else 0
    )
    if logy:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10, wrap=True)
    ax.margins(y=0.15)
    if n_series > 1 or baseline is not None:
        ax.legend(fontsize=8)
    return _save(fig, plt, out)


def bar_chart_from_rows(
    path: str | Path,
    rows: Sequence[Mapping[str, Any]],
    label_key: str,
    value_keys: Sequence[str] | Mapping[str, str],
    *,
    title: str,
    ylabel: str,
    baseline: float | None = None,
    logy: bool = False,
) -> Path | None:
    """``save_bar_chart`` over the row dicts a benchmark prints with ``print_table``.

    ``label_key`` names the configuration column; ``value_keys`` the numeric column(s),
    as a list or as ``{column: legend name}``. Rows missing a column leave that bar out.
    """
    names = dict(value_keys) if isinstance(value_keys, Mapping) else {k: k for k in value_keys}
    labels = [str(r.get(label_key, "")) for r in rows]
    series = {names[k]: [r.get(k) for r in rows] for k in names}
    values = next(iter(series.values())) if len(series) == 1 else series
    return save_bar_chart(
        path, labels, values, title=title, ylabel=ylabel, baseline=baseline, logy=logy
    )


def save_line_chart(
    path: str | Path,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
) -> Path | None:
    """Save curves as a PNG: ``{name: (xs, ys)}``, one line per name; the path written.

    Points whose x or y is None or not finite are left out. A ``.json`` path is
    replaced by the PNG beside it.
    """
    for name, (xs, ys) in series.items():
        if len(xs) != len(ys):
            raise ValueError(
                f"save_line_chart: series {name!r} has {len(xs)} x values and {len(ys)} "
                "y values; expected the same number"
            )
    plt = _pyplot()
    if plt is None:
        return None
    out = png_beside(path) if Path(path).suffix == ".json" else Path(path)
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for name, (xs, ys) in series.items():
        pts = [(_finite(x), _finite(y)) for x, y in zip(xs, ys, strict=True)]
        pts = [(x, y) for x, y in pts if x is not None and y is not None]
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker="o" if len(pts) <= 30 else None,
            label=name,
        )
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10, wrap=True)
    ax.grid(True, alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)
    return _save(fig, plt, out)


def saved(png: Path | None) -> None:
    """Print where a chart went (``PNG: <path>``), as the benchmarks print ``JSON: <path>``."""
    if png is not None:
        print(f"PNG: {png}")
