"""persia.serving.artifact: export -> load round trips, and every broken artifact refused by name."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from persia.serving import export_model, load_model
from persia.serving.signature import Signature
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.config import parse_embedding_config
from pyrsia.shared.constants import EMBEDDING_CHECKPOINT_FORMAT
from pyrsia.shared.embedding_spec import AdagradSpec
from pyrsia.shared.errors import ConfigError, InvalidInputError

EMBEDDING_YAML = """\
feature_index_prefix_bit: 8
slots_config:
  user:
    dim: 4
  items:
    dim: 3
    embedding_summation: false
    sample_fixed_size: 2
"""


class Net(torch.nn.Module):
    """Two dense inputs (one float, one int) and a summed + a raw slot; two outputs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(3 + 4 + 2 * 4, 8)
        self.head = torch.nn.Linear(8, 1)
        self.drop = torch.nn.Dropout(0.5)  # eval mode in the artifact: no randomness

    def forward(self, non_id: list[torch.Tensor], emb: list[torch.Tensor]):
        dense = torch.cat([non_id[0], non_id[1].float().unsqueeze(1)], dim=1)[:, :3]
        x = torch.cat([dense, emb[0], emb[1].flatten(1)], dim=1)
        h = self.drop(torch.relu(self.lin(x)))
        return self.head(h), h.sum(dim=1, keepdim=True)


def _inputs(batch: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    non_id = [torch.randn(batch, 2, generator=g), torch.randint(0, 9, (batch,), generator=g)]
    emb = [torch.randn(batch, 4, generator=g), torch.randn(batch, 2, 4, generator=g)]
    return non_id, emb


@pytest.fixture
def files(tmp_path):
    emb_cfg = tmp_path / "embedding_config.yml"
    emb_cfg.write_text(EMBEDDING_YAML)
    glob_cfg = tmp_path / "global_config.yml"
    glob_cfg.write_text("common_config:\n  job_type: Train\n")
    store = EmbeddingStore(10_000, num_shards=2, optimizer=AdagradSpec(lr=0.1))
    ids = np.arange(1, 500, dtype=np.uint64)
    store.lookup(ids, 4, train=True)
    ckpt = tmp_path / "ckpt"
    store.dump(ckpt, 0, 2)  # as replica 0 of 2 ...
    other = EmbeddingStore(10_000, num_shards=2, optimizer=AdagradSpec(lr=0.1))
    other.lookup(ids + np.uint64(1000), 3, train=True)
    other.dump(ckpt, 1, 2)  # ... and replica 1 of 2
    return emb_cfg, glob_cfg, ckpt, {4: store, 3: other}


def _export(tmp_path, files, **kw):
    emb_cfg, glob_cfg, ckpt, _ = files
    args = dict(
        example_inputs=_inputs(5),
        embedding_config=emb_cfg,
        global_config=glob_cfg,
        embedding_checkpoint_dir=ckpt,
        non_id_names=["dense", "bucket"],
    )
    args.update(kw)
    return export_model(tmp_path / "model", Net(), **args)


@pytest.mark.parametrize("dense_format", ["torch.export", "torchscript"])
def test_round_trip_gives_identical_predictions(tmp_path, files, dense_format):
    model = Net().eval()
    path = _export(tmp_path, files, dense_format=dense_format)
    loaded = load_model(path)
    assert loaded.signature.dense_kind == dense_format
    assert (path / loaded.signature.dense_file).is_file()
    for batch in (1, 7, 300):  # the batch dimension is dynamic, including 1
        non_id, emb = _inputs(batch, seed=batch)
        with torch.no_grad():
            want = model(non_id, emb)
        got = loaded.predict(non_id, emb)
        assert len(got) == 2
        for w, g in zip(want, got, strict=True):
            assert torch.equal(w, g)
        as_np = loaded.predict_numpy([t.numpy() for t in non_id], [t.numpy() for t in emb])
        np.testing.assert_array_equal(as_np[0], want[0].numpy())


def test_signature_records_inputs_slots_outputs_and_checkpoint(tmp_path, files):
    emb_cfg, _, _, stores = files
    sig = load_model(_export(tmp_path, files)).signature
    assert [(t.name, t.dtype, t.shape) for t in sig.non_id_inputs] == [
        ("dense", "float32", (None, 2)),
        ("bucket", "int64", (None,)),
    ]
    assert sig.id_slots == ("user", "items")
    assert [t.shape for t in sig.embedding_inputs] == [(None, 4), (None, 2, 4)]
    assert [t.shape for t in sig.outputs] == [(None, 1), (None, 1)]
    assert sig.embedding_schema == parse_embedding_config(
        __import__("yaml").safe_load(EMBEDDING_YAML)
    )
    assert sig.embedding_entries == sum(len(s) for s in stores.values())
    assert sig.embedding_replica_count == 2


def test_embedding_part_is_a_ps_checkpoint_that_loads_into_other_replica_counts(tmp_path, files):
    _, _, _, stores = files
    path = _export(tmp_path, files)
    restored = [EmbeddingStore(10_000, num_shards=1) for _ in range(3)]
    loaded = sum(s.load(path / "embedding", i, 3) for i, s in enumerate(restored))
    assert loaded == sum(len(s) for s in stores.values())
    for dim, original in stores.items():
        ids, rows = original.export_entries()[dim]
        parts = [s.export_entries()[dim] for s in restored if dim in s.export_entries()]
        got_ids = np.concatenate([p[0] for p in parts])
        got_rows = np.concatenate([p[1] for p in parts])
        order, got_order = np.argsort(ids), np.argsort(got_ids)
        np.testing.assert_array_equal(got_ids[got_order], ids[order])
        np.testing.assert_array_equal(got_rows[got_order], rows[order])


def test_config_files_are_copied(tmp_path, files):
    emb_cfg, glob_cfg, _, _ = files
    path = _export(tmp_path, files)
    assert (path / "embedding_config.yml").read_text() == emb_cfg.read_text()
    assert (path / "global_config.yml").read_text() == glob_cfg.read_text()


def test_existing_directory_is_kept_unless_overwrite(tmp_path, files):
    path = _export(tmp_path, files)
    with pytest.raises(InvalidInputError, match="export_dir"):
        _export(tmp_path, files)
    assert load_model(path)
    _export(tmp_path, files, overwrite=True, dense_format="torchscript")
    assert load_model(path).signature.dense_kind == "torchscript"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model.tmp")]


def test_failed_export_leaves_nothing(tmp_path, files):
    emb_cfg, glob_cfg, _, _ = files
    with pytest.raises(InvalidInputError, match="embedding_checkpoint_dir"):
        export_model(
            tmp_path / "model",
            Net(),
            example_inputs=_inputs(5),
            embedding_config=emb_cfg,
            embedding_checkpoint_dir=tmp_path / "nope",
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt",
        "embedding_config.yml",
        "global_config.yml",
    ]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"example_inputs": [torch.zeros(3, 2)]}, "example_inputs"),
        (
            {"example_inputs": ([torch.zeros(1, 2)], [torch.zeros(1, 4), torch.zeros(1, 2, 4)])},
            "example_inputs",
        ),
        (
            {"example_inputs": ([torch.zeros(3, 2)], [torch.zeros(3, 5), torch.zeros(3, 2, 4)])},
            r"example_inputs\[1\]\[0\]",
        ),
        ({"id_slots": ["user"]}, "id_slots"),
        ({"non_id_names": ["only_one"]}, "non_id_names"),
        ({"embedding_checkpoint_dir": None}, "exactly one of"),
        ({"dense_format": "onnx"}, "dense_format"),
    ],
)
def test_bad_export_arguments_name_the_field(tmp_path, files, kwargs, field):
    with pytest.raises(InvalidInputError, match=field):
        _export(tmp_path, files, **kwargs)


def test_unknown_slot_is_a_config_error(tmp_path, files):
    with pytest.raises(ConfigError, match="nope"):
        _export(tmp_path, files, id_slots=["user", "nope"])


def _edit_signature(path, edit):
    sig = json.loads((path / "signature.json").read_text())
    edit(sig)
    (path / "signature.json").write_text(json.dumps(sig))


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda s: s.update(format_version=2), "format_version"),
        (lambda s: s.update(format="other"), "format"),
        (lambda s: s.pop("id_slots"), "id_slots"),
        (lambda s: s.update(id_slots=["user", "ghost"]), r"id_slots\[1\]"),
        (lambda s: s["dense"].update(kind="onnx"), "dense.kind"),
        (lambda s: s["dense"].update(file="../x.pt2"), "dense.file"),
        (lambda s: s["non_id_inputs"][0].update(shape=[4, 2]), r"non_id_inputs\[0\].shape"),
        (lambda s: s["non_id_inputs"][0].update(dtype="complex"), r"non_id_inputs\[0\].dtype"),
        (
            lambda s: s["embedding_inputs"][0].update(shape=[None, 5]),
            r"embedding_inputs\[0\].shape",
        ),
        (lambda s: s.update(outputs=[]), "outputs"),
        (lambda s: s["embedding"].update(replica_count=3), "embedding.replica_count"),
        (
            lambda s: s["embedding_schema"]["slots_config"]["user"].update(dim="x"),
            "embedding_schema",
        ),
    ],
)
def test_load_refuses_a_bad_signature_naming_the_field(tmp_path, files, edit, field):
    path = _export(tmp_path, files)
    _edit_signature(path, edit)
    with pytest.raises(InvalidInputError, match=f"signature.json: {field}"):
        load_model(path)


def test_load_refuses_missing_or_mismatched_parts(tmp_path, files):
    path = _export(tmp_path, files)
    with pytest.raises(InvalidInputError, match="signature.json"):
        load_model(tmp_path)  # not an artifact
    (path / "signature.json").write_text("{not json")
    with pytest.raises(InvalidInputError, match="readable JSON"):
        load_model(path)
    path = _export(tmp_path, files, overwrite=True)
    (path / "embedding_config.yml").write_text(EMBEDDING_YAML.replace("dim: 4", "dim: 5"))
    with pytest.raises(InvalidInputError, match="embedding_config.yml"):
        load_model(path)
    path = _export(tmp_path, files, overwrite=True)
    (path / "dense.pt2").unlink()
    with pytest.raises(InvalidInputError, match="dense.pt2"):
        load_model(path)
    path = _export(tmp_path, files, overwrite=True)
    (path / "embedding" / "replica_1.manifest.json").unlink()
    with pytest.raises(InvalidInputError, match=r"missing \[1\]"):
        load_model(path)
    shutil.rmtree(path / "embedding")
    with pytest.raises(InvalidInputError, match="embedding_checkpoint_dir"):
        load_model(path)


def test_signature_to_dict_round_trips(tmp_path, files):
    sig = load_model(_export(tmp_path, files)).signature
    assert Signature.from_dict(json.loads(json.dumps(sig.to_dict()))) == sig


def test_checkpoint_format_name_is_the_ps_one():
    from pyrsia.services.embedding_ps import checkpoint

    assert checkpoint.FORMAT == EMBEDDING_CHECKPOINT_FORMAT


def test_export_from_a_live_training_context(redis_server, tmp_path):
    """The PS replicas dump straight into the artifact; served = eval predictions."""
    import uuid

    from persia.ctx import TrainCtx, eval_ctx
    from persia.embedding.optim import Adagrad
    from tests.nn_helpers import EMBEDDING_CONFIG, SmallModel, environ, job_services, make_batch

    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"art-{uuid.uuid4().hex[:8]}"}
    config = tmp_path / "embedding_config.yml"
    config.write_text(EMBEDDING_CONFIG)
    model = SmallModel()
    ids = list(range(1, 41))
    with environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None):
        with job_services(env, tmp_path / "svc", ps_replicas=2):
            with TrainCtx(
                Adagrad(lr=0.1),
                torch.optim.SGD(model.parameters(), lr=0.1),
                model=model,
                mixed_precision=False,
            ) as ctx:
                for step in range(3):
                    batch = ctx.get_embedding_from_data(make_batch(ids, seed=step))
                    output, labels = ctx.forward(batch)
                    ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
                probe = make_batch(ids, requires_grad=False, seed=9)
                with eval_ctx(model=model) as ectx, torch.no_grad():
                    looked_up = ectx.get_embedding_from_data(probe)
                    want, _ = ectx.forward(looked_up)
                non_id, emb, _ = ectx.prepare_features(looked_up)
                path = export_model(
                    tmp_path / "model",
                    model,
                    example_inputs=(non_id, emb),
                    embedding_config=config,
                    ctx=ctx,
                )
                sizes = ctx.get_embedding_size()
    loaded = load_model(path)
    assert loaded.signature.embedding_replica_count == 2
    assert loaded.signature.embedding_entries == sum(sizes) > 0
    assert torch.equal(loaded.predict(non_id, emb)[0], want)
    # the embedding part holds the trained vectors the eval lookup saw
    restored = EmbeddingStore(10_000, num_shards=1)
    restored.load(path / "embedding", 0, 1)
    prefix = np.uint64(loaded.schema.slot_prefixes()["a"])
    a_ids = np.asarray(ids, np.uint64) % np.uint64((1 << 56) - 1) + prefix
    np.testing.assert_array_equal(restored.lookup(a_ids, 4, train=False), emb[0].numpy())
