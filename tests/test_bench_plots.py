"""benchmarks/plots.py writes valid PNGs beside a benchmark's JSON.

The checks read the files back: the PNG signature and IHDR header, a decode with
matplotlib's own reader, and pixels that are not one flat colour (a chart was drawn).
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import plots  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _check_png(path: Path) -> tuple[int, int]:
    """Width and height of a valid, decodable, non-blank PNG at ``path``."""
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} does not start with the PNG signature"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100
    pixels = mpimg.imread(path)
    assert pixels.shape[:2] == (height, width)
    assert pixels.std() > 0.01, "the image is one flat colour: nothing was drawn"
    return width, height


def test_bar_chart_is_written_beside_the_json_as_a_valid_png(tmp_path):
    json_path = tmp_path / "e2e-20260101-120000.json"
    json_path.write_text("{}")
    out = plots.save_bar_chart(
        json_path,
        ["single process", "pyrsia", "pyrsia bf16"],
        [1000.0, 2500.0, None],  # a missing run leaves its bar out
        title="samples/s",
        ylabel="samples/s",
        baseline=1000.0,
    )
    assert out == tmp_path / "e2e-20260101-120000.png"
    _check_png(out)


def test_grouped_bars_from_table_rows_and_a_line_chart(tmp_path):
    rows = [
        {"mode": "a", "median": 3.0, "best": 3.5},
        {"mode": "b", "median": 5.0, "best": "-"},
    ]
    bars = plots.bar_chart_from_rows(
        tmp_path / "bars.png",
        rows,
        "mode",
        {"median": "median", "best": "best"},
        title="t",
        ylabel="y",
    )
    _check_png(bars)
    line = plots.save_line_chart(
        tmp_path / "curve.json",
        {
            "loss": ([1, 2, 3, 4], [0.7, 0.5, float("nan"), 0.4]),
            "auc": ([1, 2, 3, 4], [0.6, 0.7, 0.8, 0.85]),
        },
        title="curve",
        xlabel="step",
        ylabel="value",
    )
    assert line == tmp_path / "curve.png"
    _check_png(line)


def test_mismatched_lengths_are_refused_naming_the_series(tmp_path):
    with pytest.raises(ValueError, match="series 'median' has 1 values for 2 labels"):
        plots.save_bar_chart(
            tmp_path / "x.png", ["a", "b"], {"median": [1.0]}, title="t", ylabel="y"
        )
    with pytest.raises(ValueError, match="series 'loss' has 2 x values and 1 y values"):
        plots.save_line_chart(
            tmp_path / "x.png", {"loss": ([1, 2], [1])}, title="t", xlabel="x", ylabel="y"
        )
    assert not (tmp_path / "x.png").exists()


def test_without_matplotlib_no_png_and_one_line_saying_how_to_install(tmp_path):
    code = (
        "import sys; sys.modules['matplotlib'] = None; sys.path.insert(0, 'benchmarks'); import plots; "
        f"r = plots.save_bar_chart({str(tmp_path / 'x.png')!r}, ['a'], [1.0], title='t', ylabel='y'); "
        "print('returned', r)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "returned None" in proc.stdout
    assert (
        proc.stderr.strip()
        == "no PNG written: matplotlib is not installed (pip install -e '.[bench]')"
    )
    assert not (tmp_path / "x.png").exists()
