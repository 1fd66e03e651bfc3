"""hb.metrics and hb.data give the documented answer or refuse: no silently wrong metric.

- ``Accuracy`` compares class ids for equality (HybridBackend's semantics), thresholds
  only when asked to, and refuses probabilities, logits and mismatched shapes;
- the exact AUC keeps float64 scores, so scores 1e-9 apart are not a tie;
- the functional ``auc()`` / ``accuracy()`` accumulate over the ``steps`` batches of one
  evaluation (TF-metric style: updates since the evaluation began), checked against a
  rank-statistic reference computed here;
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import persia.hb as hb
from pyrsia.shared.errors import InvalidInputError
from tests.redis_server import free_port


@pytest.fixture(autouse=True)
def fresh_options():
    hb.context.options.reload_env({})
    yield
    hb.context.options.reload_env({})


def rank_statistic_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Mann-Whitney U / (P N) in float64, ties at their average rank (no sklearn)."""
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(labels) > 0.5
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(scores.size, dtype=np.float64)
    sorted_scores = scores[order]
    start = 0
    while start < scores.size:  # average rank over each run of equal scores
        end = start
        while end + 1 < scores.size and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    p, n = int(positive.sum()), int((~positive).sum())
    return float((ranks[positive].sum() - p * (p + 1) / 2.0) / (p * n))


# --- 1. Accuracy: HybridBackend's equality, not a hidden 0.5 threshold -------------------


def test_accuracy_compares_class_ids_for_equality():
    assert hb.metrics.accuracy([0, 1, 2, 3], [0, 1, 3, 2]).result() == 0.5
    assert (
        hb.metrics.accuracy(torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2, 3])).result() == 1.0
    )
    # float class ids (integer-valued) compare as ids; (B, 1) predictions squeeze to (B,)
    assert hb.metrics.accuracy(np.array([1.0, 0.0]), np.array([[1.0], [1.0]])).result() == 0.5
    # rank-2 labels and predictions of one shape compare element by element (as HB's)
    assert hb.metrics.accuracy([[0, 1], [1, 1]], [[0, 1], [0, 1]]).result() == 0.75


def test_accuracy_refuses_scores_and_logits_without_a_threshold():
    with pytest.raises(InvalidInputError, match=r"predictions: expected class ids.*threshold=0\.5"):
        hb.metrics.accuracy([0, 1], [0.2, 0.9])
    with pytest.raises(InvalidInputError, match=r"argmax"):
        hb.metrics.accuracy(torch.tensor([0, 1]), torch.randn(2, 3))  # logits of 3 classes
    with pytest.raises(InvalidInputError, match="labels: expected class ids"):
        hb.metrics.accuracy([0.5, 1.0], [0, 1])
    with pytest.raises(InvalidInputError, match="labels: expected as many values as predictions"):
        hb.metrics.accuracy([0, 1, 1], [0, 1])
    with pytest.raises(InvalidInputError, match="predictions: expected numbers"):
        hb.metrics.accuracy(["a", "b"], ["a", "b"])


def test_accuracy_with_a_threshold_is_binary_and_refuses_other_labels():
    metric = hb.metrics.Accuracy(threshold=0.5)
    metric.update([0, 1, 1, 0], [0.2, 0.9, 0.4, 0.6])
    assert metric.result() == 0.5
    with pytest.raises(InvalidInputError, match=r"labels: expected 0 or 1"):
        metric.update([0, 2], [0.1, 0.9])
    with pytest.raises(InvalidInputError, match="threshold"):
        hb.metrics.Accuracy(threshold=float("nan"))


def test_functional_settings_are_keyword_only():
    """HB's third positional argument is ``weights``: a ported call must not set a threshold."""
    with pytest.raises(TypeError):
        hb.metrics.accuracy([0, 1], [0, 1], 1.0)
    with pytest.raises(TypeError):
        hb.metrics.auc([0, 1], [0.2, 0.8], 2)


def test_auc_refuses_labels_other_than_0_and_1():
    with pytest.raises(InvalidInputError, match=r"labels: expected 0 or 1"):
        hb.metrics.auc([0, 0.3, 1], [0.1, 0.2, 0.3])
    with pytest.raises(InvalidInputError, match="labels: expected as many values as predictions"):
        hb.metrics.auc([0, 1], torch.rand(2, 2))


# --- 2. exact AUC: float64 scores ------------------------------------------------------


def test_exact_auc_keeps_scores_1e9_apart_apart():
    base = 0.7
    scores = np.array([base, base + 1e-9, base + 2e-9, base + 3e-9], dtype=np.float64)
    labels = np.array([0, 1, 0, 1])
    assert np.float32(scores[0]) == np.float32(scores[3])  # one value in float32
    expected = rank_statistic_auc(labels, scores)
    assert expected == 0.75
    assert hb.metrics.auc(labels, scores).result() == expected
    streamed = hb.metrics.AUC()
    streamed.update(labels[:2], torch.from_numpy(scores[:2]))  # float64 tensors too
    streamed.update(labels[2:], torch.from_numpy(scores[2:]))
    assert streamed.result() == expected


# --- 3. the functional metrics accumulate over one evaluation's steps ------------------


def _eval_batches(k: int, size: int = 50) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    batches = []
    for i in range(k):
        labels = (rng.random(size) < 0.2 + 0.15 * i).astype(np.int64)  # batches differ
        scores = np.clip(0.3 * labels + rng.normal(0.4 + 0.05 * i, 0.2, size), 0, 1)
        batches.append((labels, scores))
    return batches


@pytest.mark.parametrize("k", [1, 4])
def test_evaluation_of_k_steps_reports_the_auc_of_all_k_batches(k):
    batches = _eval_batches(k)
    labels = np.concatenate([b[0] for b in batches])
    scores = np.concatenate([b[1] for b in batches])
    reference = rank_statistic_auc(labels, scores)
    pending = iter(batches)

    def eval_fn():  # HybridBackend's form: one batch per call, `steps` calls
        y, p = next(pending)
        return {
            "auc": hb.metrics.auc(y, p),
            "accuracy": hb.metrics.accuracy(y, p, threshold=0.5),
        }

    hook = hb.train.EvaluationHook(eval_fn, steps=k)
    values = hook.evaluate(10)
    assert values["auc"] == pytest.approx(reference, abs=1e-12)
    assert values["accuracy"] == pytest.approx(float(((scores > 0.5) == labels).mean()))
    if k > 1:
        last = batches[-1]
        assert values["auc"] != pytest.approx(rank_statistic_auc(*last), abs=1e-6)
    # the next evaluation starts from zero: its value is its own batches' AUC only
    pending = iter(_eval_batches(k)[::-1])
    assert hook.evaluate(20)["auc"] == pytest.approx(reference, abs=1e-12)


def test_functional_auc_in_a_loop_accumulates_over_the_evaluation():
    batches = _eval_batches(3)
    labels = np.concatenate([b[0] for b in batches])
    scores = np.concatenate([b[1] for b in batches])

    def eval_fn():  # Pyrsia's form: one call runs the whole evaluation
        for y, p in batches:
            metric = hb.metrics.auc(y, p)
        return {"auc": metric}

    history = hb.train.train_and_evaluate(lambda batch: None, range(2), eval_fn=eval_fn)
    assert history[-1][1]["auc"] == pytest.approx(rank_statistic_auc(labels, scores), abs=1e-12)
    assert hb.metrics.auc(*batches[0]).result() == pytest.approx(
        rank_statistic_auc(*batches[0]), abs=1e-12
    )  # outside an evaluation: a fresh metric holding this batch


def test_evaluation_steps_refuse_what_would_be_silently_wrong():
    batches = iter(_eval_batches(3))

    def fresh_object_per_step():  # a new metric each step would hold only the last batch
        metric = hb.metrics.AUC()
        metric.update(*next(batches))
        return {"auc": metric}

    with pytest.raises(InvalidInputError, match=r"eval_fn\(\).*auc.*new metric"):
        hb.train.EvaluationHook(fresh_object_per_step, steps=2).evaluate(1)

    def two_heads_one_line():  # one call site, two metrics in one step: needs names
        y, p = _eval_batches(1)[0]
        metrics = [hb.metrics.auc(y, q) for q in (p, 1 - p)]
        return {"a": metrics[0], "b": metrics[1]}

    with pytest.raises(InvalidInputError, match="name="):
        hb.train.EvaluationHook(two_heads_one_line, steps=2).evaluate(1)

    def short():
        return {"auc": hb.metrics.auc(*next(batches))}

    batches = iter(_eval_batches(2))
    with pytest.raises(InvalidInputError, match=r"steps: expected at most the 2 batches"):
        hb.train.EvaluationHook(short, steps=3).evaluate(1)
    with pytest.raises(InvalidInputError, match="steps"):
        hb.train.EvaluationHook(short, steps=0)


def test_named_functional_metrics_are_told_apart():
    y, p = _eval_batches(1)[0]

    def two_heads():
        return {name: hb.metrics.auc(y, q, name=name) for name, q in (("a", p), ("b", 1 - p))}

    values = hb.train.EvaluationHook(two_heads, steps=2).evaluate(1)
    assert values["a"] == pytest.approx(rank_statistic_auc(y, p), abs=1e-12)
    assert values["b"] == pytest.approx(1 - rank_statistic_auc(y, p), abs=1e-12)

    def one_name_two_kinds():
        return {"a": hb.metrics.auc(y, p, name="a"), "b": hb.metrics.accuracy(y, y, name="a")}

    with pytest.raises(InvalidInputError, match="name: expected one kind and setting"):
        hb.train.EvaluationHook(one_name_two_kinds, steps=1).evaluate(1)
    with pytest.raises(InvalidInputError, match="name: expected a non-empty string"):
        hb.metrics.auc(y, p, name="")


# --- on two gloo ranks: the union of both ranks' steps, scores 1e-9 apart kept apart ----

RANK_STEPS = 3


def rank_batches(rank: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Rank ``rank``'s 3 evaluation batches; the ranks' first scores differ by 1e-9."""
    rng = np.random.default_rng(100 + rank)
    batches = []
    for _ in range(RANK_STEPS):
        labels = (rng.random(40) < 0.4).astype(np.int64)
        scores = np.clip(0.2 * labels + rng.normal(0.5, 0.2, 40), 0, 1)
        scores[0], labels[0] = 0.7 + 1e-9 * rank, rank
        batches.append((labels, scores))
    return batches


RANK_SCRIPT = """
import json, sys
from torch.utils.data import IterableDataset
import persia.hb as hb
sys.path.insert(0, sys.argv[2])
from test_hb_metrics_correct import RANK_STEPS, rank_batches

rank = hb.context.rank
pending = iter(rank_batches(rank))

def eval_fn():
    y, p = next(pending)
    return {"auc": hb.metrics.auc(y, p)}

values = hb.train.EvaluationHook(eval_fn, steps=RANK_STEPS).evaluate(1)

class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(41))

evals = [b.tolist() for b in hb.data.make_one_shot_iterator(
    Stream(), batch_size=4, num_workers=2, drop_remainder=False)]
synced = [b.tolist() for b in hb.data.make_one_shot_iterator(Stream(), batch_size=4, num_workers=2)]
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
    json.dump({"auc": values["auc"], "eval": evals, "synced": synced}, f)
hb.context.destroy_process_group()
"""


def test_two_ranks_steps_auc_is_the_union_and_workers_share_the_stream(tmp_path):
    repo = Path(__file__).resolve().parents[1]
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
            str(repo / "tests"),
        ],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    parts = rank_batches(0) + rank_batches(1)
    labels = np.concatenate([y for y, _ in parts])
    scores = np.concatenate([p for _, p in parts])
    reference = rank_statistic_auc(labels, scores)  # all 2 x 3 batches, float64
    assert [r["auc"] for r in ranks] == [pytest.approx(reference, abs=1e-12)] * 2
    evaluated = Counter(x for r in ranks for batch in r["eval"] for x in batch)
    assert evaluated == Counter(range(41))  # 2 ranks x 2 workers: each sample once
    assert len(ranks[0]["synced"]) == len(ranks[1]["synced"])  # stopped together
    synced = Counter(x for r in ranks for batch in r["synced"] for x in batch)
    assert max(synced.values()) == 1 and set(synced) <= set(range(41))
