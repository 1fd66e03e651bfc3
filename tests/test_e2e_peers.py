"""The end-to-end benchmark's single-process peers (``--peers``, benchmarks/e2e/peers.py): a
peer that is not installed is skipped with a line saying why, and every Pyrsia side is paired
with the peer's run of the same round."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "benchmarks" / "e2e"))

from e2e.peers import format_peer_pairs, peer_medians, peer_pairs, resolve_peers  # noqa: E402
from e2e_cli import parse_args  # noqa: E402
from torchrec_peer import torchrec_missing  # noqa: E402


def run(samples_per_s: float, auc: float, threads: int = 2) -> dict:
    return {"samples_per_s": samples_per_s, "auc": auc, "threads": threads}


def test_a_missing_peer_is_skipped_with_a_line_naming_it_and_why():
    ran, skipped = resolve_peers(
        ["torchrec"], {"torchrec": lambda: "TorchRec is not importable (ImportError: x)"}
    )
    assert ran == []
    assert skipped == ["[peers] torchrec peer skipped: TorchRec is not importable (ImportError: x)"]
    assert resolve_peers(["torchrec"], {"torchrec": lambda: None}) == (["torchrec"], [])


def test_each_pyrsia_run_is_paired_with_the_peer_run_of_its_round():
    runs = {
        "pyrsia_embedded": [run(1100.0, 0.9444), run(900.0, 0.9443), run(1000.0, 0.9445)],
        "torchrec": [run(1000.0, 0.9447), run(1000.0, 0.9447), run(800.0, 0.9446)],
    }
    pairs = peer_pairs(runs, ["pyrsia_embedded"], "torchrec")
    assert [q["ratio"] for q in pairs] == pytest.approx([1.1, 0.9, 1.25])
    assert pairs[0]["auc_gap"] == pytest.approx(0.9444 - 0.9447)
    medians = peer_medians(pairs)
    assert medians["pyrsia_embedded"]["ratio"] == pytest.approx(1.1)
    assert medians["pyrsia_embedded"]["auc_gap"] == pytest.approx(-0.0003)
    assert format_peer_pairs(pairs, "pyrsia_embedded").startswith("2t 1.10 (AUC -0.0003), 2t 0.90")


def test_peers_flag_runs_torchrec_only_where_it_is_installed(capsys):
    _, args = parse_args(["--peers", "torchrec", "--modes", "embedded"], "e2e")
    missing = torchrec_missing()
    assert args.torchrec is (missing is None)
    assert args.peers == ([] if missing else ["torchrec"])
    out = capsys.readouterr().out
    assert ("[peers] torchrec peer skipped: TorchRec is not importable" in out) is bool(missing)
    _, args = parse_args(["--modes", "embedded"], "e2e")
    assert args.peers == [] and args.torchrec is False


def test_an_unknown_peer_exits_2_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--peers", "torchrec,faiss"], "e2e")
    assert exc.value.code == 2
    assert "--peers: expected distinct values among ('torchrec',)" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(240)
def test_e2e_bench_quick_embedded_with_the_torchrec_peer(tmp_path):
    """The peer runs in the same rounds and the PEER line follows the RESULT line; without
    TorchRec the run goes on without it, after the line saying why."""
    out_json = tmp_path / "e2e.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "e2e_bench.py"),
            "--quick",
            "--modes",
            "embedded",
            "--peers",
            "torchrec",
            "--json",
            str(out_json),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=230,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    result = json.loads(out_json.read_text())["results"][0]
    if torchrec_missing() is not None:
        assert "[peers] torchrec peer skipped" in proc.stdout
        assert "peer_pairs" not in result
        return
    assert len(result["runs"]["torchrec"]) == len(result["runs"]["pyrsia_embedded"]) == 1
    (pair,) = result["peer_pairs"]
    assert pair["side"] == "pyrsia_embedded" and pair["ratio"] > 0
    assert "PEER torchrec pyrsia_vs_peer=" in proc.stdout.split("RESULT ", 1)[1]
