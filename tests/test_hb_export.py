"""hb.train.export: the trained hb model as a serving artifact that predicts what training did.

Job A trains a plain-torch model with sharded tables on real services and exports it.
Job B is a fresh PS + embedding worker (another job id, empty tables) that loads only the
artifact's embedding checkpoint; the artifact's dense model, fed with job B's embeddings,
must give the predictions job A computed.
"""

from __future__ import annotations

import json
import uuid

import pytest
import torch
from torch import nn

import persia.hb as hb
from persia.embedding.optim import SGD
from persia.serving.artifact import load_model
from pyrsia.shared.errors import InvalidInputError
from tests.hb_helpers import (
    HB_EMBEDDING_CONFIG,
    AdultWideModel,
    adult_tensors,
    reset_hb,
)
from tests.nn_helpers import job_services

BATCH = 128


class ComputedIds(AdultWideModel):
    def forward(self, dense, cat_ids, education):
        return self.mlp(torch.cat([dense, self.cats(cat_ids + 0), self.education(education)], 1))


def test_exported_artifact_predicts_what_the_training_job_did(job_env, tmp_path, monkeypatch):
    dense, cats, education, label = adult_tensors("train")
    reset_hb()
    hb.context.options.embedding_optimizer = SGD(lr=0.1)
    try:
        with job_services(job_env, tmp_path / "job_a", embedding_config=HB_EMBEDDING_CONFIG):
            path, trained = _train_and_export(tmp_path, dense, cats, education, label)
            _assert_unexportable_models_are_refused(tmp_path, dense, cats, education)
    finally:
        reset_hb()

    signature = json.loads((path / "signature.json").read_text())
    assert signature["dense"]["kind"] == "torch.export"  # the hb dense view exports cleanly
    assert signature["id_slots"] == ["cats", "education"]
    assert [i["name"] for i in signature["non_id_inputs"]] == ["dense"]
    assert signature["embedding"]["entries"] > 0
    served = load_model(path)

    job_b = {**job_env, "PERSIA_JOB_ID": f"serve-{uuid.uuid4().hex[:8]}"}
    monkeypatch.setenv("PERSIA_JOB_ID", job_b["PERSIA_JOB_ID"])
    hb.context.options.embedding_optimizer = SGD(lr=0.1)
    try:
        with job_services(job_b, tmp_path / "job_b", embedding_config=HB_EMBEDDING_CONFIG):
            served_out = _predict_from_the_artifact(path, served, dense, cats, education)
    finally:
        reset_hb()
    print(
        f"\nexported vs training predictions: max |diff| {(served_out - trained).abs().max():.3g}"
    )
    torch.testing.assert_close(served_out, trained, rtol=0, atol=1e-5)


def _train_and_export(tmp_path, dense, cats, education, label):
    """Job A: an AdultWideModel with sharded tables trained 10 batches, exported to
    ``tmp_path / "model"``. Returns (the artifact's path, its predictions for 500 rows)."""
    with hb.scope(sharding=True):
        model = AdultWideModel()
    opt = hb.wraps(torch.optim.SGD)(model.parameters(), lr=0.1)
    for start in range(0, 10 * BATCH, BATCH):
        b = slice(start, start + BATCH)
        loss = nn.functional.binary_cross_entropy_with_logits(
            model(dense[b], cats[b], education[b]), label[b]
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    path = hb.train.export(
        tmp_path / "model",
        model=model,
        non_id_names=["dense"],
        example_inputs=(dense[:64], cats[:64], education[:64]),
    )
    model.eval()
    with torch.no_grad():
        trained = model(dense[:500], cats[:500], education[:500])
    return path, trained


def _assert_unexportable_models_are_refused(tmp_path, dense, cats, education):
    """A mean-mode bag and ids computed from a model argument are refused, writing nothing."""
    with hb.scope(sharding=True):
        mean_bag = nn.EmbeddingBag(8 * 128, 8, mode="mean")
        computed = ComputedIds()
    mean_bag.slot = "cats"
    with pytest.raises(InvalidInputError, match="mode='sum'"):
        hb.train.export(tmp_path / "x", model=nn.Sequential(mean_bag), example_inputs=(cats[:4],))
    with pytest.raises(InvalidInputError, match="called with one of the model's arguments"):
        hb.train.export(
            tmp_path / "y", model=computed, example_inputs=(dense[:4], cats[:4], education[:4])
        )
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def _predict_from_the_artifact(path, served, dense, cats, education):
    """Job B: load the artifact's embedding checkpoint into the fresh PS, look the 500 rows up
    through sharded tables, and return the served dense model's predictions."""
    from persia.hb._ps import connection

    connection.load(str(path / "embedding"))
    with hb.scope(sharding=True):
        cats_probe = nn.EmbeddingBag(8 * 128, 8, mode="sum")
        edu_probe = nn.Embedding(128, 8)
    cats_probe.slot, edu_probe.slot = "cats", "education"
    with torch.no_grad():
        embeddings = [cats_probe.eval()(cats[:500]), edu_probe.eval()(education[:500])]
    assert embeddings[0].abs().sum() > 0  # job B's tables came from the artifact
    (served_out,) = served.predict([dense[:500]], embeddings)
    return served_out
