"""hb.metrics, hb.data and hb.train.train_and_evaluate: in one process, and on two gloo ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import persia.hb as hb
from persia.hb.data import _ShareSampler
from pyrsia.shared.errors import InvalidInputError
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]


def pairwise_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The AUC's definition, P(s+ > s-) + P(s+ == s-) / 2 over every pair (what sklearn computes)."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (pos.size * neg.size))


def rank_data(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Unequal, tied, per-rank scores: rank 0 has 1100 samples, rank 1 has 900."""
    rng = np.random.default_rng(rank)
    n = 1100 if rank == 0 else 900
    labels = (rng.random(n) < 0.3).astype(np.float32)
    scores = np.round(np.clip(0.35 * labels + rng.normal(0.4, 0.2, n), 0, 1), 2)  # ties
    return labels, scores.astype(np.float32)


@pytest.fixture(autouse=True)
def fresh_options():
    hb.context.options.reload_env({})
    yield
    hb.context.options.reload_env({})


def test_streaming_exact_auc_equals_the_pairwise_definition():
    labels, scores = (
        np.concatenate(parts) for parts in zip(rank_data(0), rank_data(1), strict=True)
    )
    metric = hb.metrics.AUC()
    for start in range(0, len(labels), 333):  # streamed in batches
        metric.update(torch.from_numpy(labels[start : start + 333]), scores[start : start + 333])
    assert metric.result() == pytest.approx(pairwise_auc(labels, scores), abs=1e-12)
    metric.reset()
    assert np.isnan(metric.result())


def test_bucketed_auc_is_close_and_accuracy_counts():
    labels, scores = rank_data(0)
    exact = pairwise_auc(labels, scores)
    assert hb.metrics.auc(labels, scores, num_thresholds=1000).result() == pytest.approx(
        exact, abs=2e-3
    )
    accuracy = hb.metrics.accuracy(labels, scores, threshold=0.5)
    assert accuracy.result() == pytest.approx(float(((scores > 0.5) == (labels > 0.5)).mean()))


def test_metrics_refuse_bad_input():
    with pytest.raises(InvalidInputError, match="labels: expected as many values as predictions"):
        hb.metrics.auc([1, 0], [0.5])
    with pytest.raises(InvalidInputError, match="predictions: expected finite"):
        hb.metrics.auc([1, 0], [0.5, float("nan")])
    with pytest.raises(InvalidInputError, match=r"predictions: expected scores in \[0, 1\]"):
        hb.metrics.auc([1, 0], [0.5, 2.0], num_thresholds=10)
    with pytest.raises(InvalidInputError, match="num_thresholds"):
        hb.metrics.AUC(num_thresholds=1)


def test_rank_shares_cover_the_dataset_once_or_equally():
    shares = [list(_ShareSampler(10, r, 3, seed=-1, drop_remainder=False)) for r in range(3)]
    assert sorted(sum(shares, [])) == list(range(10)) and [len(s) for s in shares] == [4, 3, 3]
    equal = [list(_ShareSampler(10, r, 3, seed=5, drop_remainder=True)) for r in range(3)]
    assert [len(s) for s in equal] == [3, 3, 3] and len(set(sum(equal, []))) == 9
    assert [len(_ShareSampler(10, r, 3, seed=5, drop_remainder=True)) for r in range(3)] == [
        3,
        3,
        3,
    ]


def test_iterators_in_one_process():
    data = TensorDataset(torch.arange(10))
    one_shot = hb.data.make_one_shot_iterator(data, batch_size=4)
    assert [b[0].tolist() for b in one_shot] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert list(one_shot) == []  # one shot
    again = hb.data.make_initializable_iterator(data, batch_size=4, seed=3)
    with pytest.raises(RuntimeError, match="initialize"):
        again.get_next()
    again.initialize(epoch=0)
    first = torch.cat([b[0] for b in again])
    again.initialize(epoch=1)
    second = torch.cat([b[0] for b in again])
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(10))
    assert first.tolist() != second.tolist()  # reshuffled per epoch
    with pytest.raises(InvalidInputError, match="batch_size"):
        hb.data.make_one_shot_iterator(data)  # no batch_size and options.batch_size unset
    hb.context.options.batch_size = 5
    assert len(hb.data.make_one_shot_iterator(data)) == 2


def test_train_and_evaluate_calls_eval_fn_every_n_iter_and_at_the_end():
    seen = []

    def eval_fn():
        metric = hb.metrics.Accuracy(threshold=0.5)
        metric.update([1.0], [0.9 if len(seen) % 2 else 0.1])
        return {"accuracy": metric, "steps": len(seen)}

    history = hb.train.train_and_evaluate(
        seen.append, range(7), eval_fn=eval_fn, eval_every_n_iter=3
    )
    assert [step for step, _ in history] == [3, 6, 7]
    assert history[0][1] == {"accuracy": 1.0, "steps": 3.0}  # 3 steps seen: odd -> 0.9
    assert hb.train.train_and_evaluate(seen.append, range(100), max_steps=2) == []
    with pytest.raises(InvalidInputError, match="eval_every_n_iter"):
        hb.train.train_and_evaluate(seen.append, [], eval_fn=eval_fn, eval_every_n_iter=0)


RANK_SCRIPT = """
import json, sys
import numpy as np, torch
from torch.utils.data import IterableDataset, TensorDataset
import persia.hb as hb
sys.path.insert(0, sys.argv[2])
from test_hb_metrics_data import rank_data

out = sys.argv[1]
rank = hb.context.rank
labels, scores = rank_data(rank)
exact, bucketed, acc = hb.metrics.AUC(), hb.metrics.AUC(num_thresholds=1000), hb.metrics.Accuracy(threshold=0.5)
for start in range(0, len(labels), 128):
    for metric in (exact, bucketed, acc):
        metric.update(labels[start:start + 128], scores[start:start + 128])

class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(11))

one_shot = [b[0].tolist() for b in hb.data.make_one_shot_iterator(TensorDataset(torch.arange(11)), batch_size=2)]
evals = [b[0].tolist() for b in hb.data.make_one_shot_iterator(
    TensorDataset(torch.arange(11)), batch_size=2, drop_remainder=False)]
stream = [b.tolist() for b in hb.data.make_one_shot_iterator(Stream(), batch_size=2)]

def eval_fn():
    metric = hb.metrics.AUC()
    metric.update(labels, scores)
    return {"auc": metric}

history = hb.train.train_and_evaluate(lambda batch: None, range(5), eval_fn=eval_fn, eval_every_n_iter=2)
json.dump({"exact": exact.result(), "bucketed": bucketed.result(), "accuracy": acc.result(),
           "one_shot": one_shot, "eval": evals, "stream": stream, "history": history},
          open(f"{out}/rank{rank}.json", "w"))
hb.context.destroy_process_group()  # gloo's threads torn down before exit, not during it
"""


@pytest.mark.slow
def test_two_ranks_metrics_equal_the_union_and_data_is_shared_out(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "persia.hb.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            sys.executable,
            str(script),
            str(tmp_path),
            str(REPO / "tests"),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    labels, scores = (np.concatenate(p) for p in zip(rank_data(0), rank_data(1), strict=True))
    union_auc = pairwise_auc(labels, scores)
    union_accuracy = float(((scores > 0.5) == (labels > 0.5)).mean())
    print(
        f"\nunion AUC {union_auc:.6f}; ranks: exact {[r['exact'] for r in ranks]}, "
        f"bucketed {[r['bucketed'] for r in ranks]}"
    )
    for r in ranks:
        assert r["exact"] == pytest.approx(union_auc, abs=1e-4)
        assert r["bucketed"] == pytest.approx(union_auc, abs=2e-3)
        assert r["accuracy"] == pytest.approx(union_accuracy, abs=1e-9)
        assert [step for step, _ in r["history"]] == [2, 4, 5]
        assert all(v["auc"] == pytest.approx(union_auc, abs=1e-4) for _, v in r["history"])
    one_shot = [sum(r["one_shot"], []) for r in ranks]
    assert len(ranks[0]["one_shot"]) == len(ranks[1]["one_shot"])  # equal batches per rank
    assert sorted(one_shot[0] + one_shot[1]) == list(range(10))  # 11 % 2: one sample dropped
    assert sorted(sum(ranks[0]["eval"], []) + sum(ranks[1]["eval"], [])) == list(range(11))
    assert len(ranks[0]["stream"]) == len(ranks[1]["stream"])  # stopped together
    streamed = sum(ranks[0]["stream"], []) + sum(ranks[1]["stream"], [])
    assert len(set(streamed)) == len(streamed) and set(streamed) <= set(range(11))
