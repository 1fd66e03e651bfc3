"""The batch a data loader sends is the batch that trains, or it is refused at once.

- A loader that refills one numpy buffer per batch sends each batch's own ids, dense
  values and labels (``PersiaBatch`` owns copies of its arrays from construction on).
- Non-finite labels and float dense features are refused by ``PersiaBatch`` and by the NN
  worker's ingress (``DensePart.from_wire``), naming the field, its name and the first bad row.
- Non-negative signed integer ids (and unsigned ids narrower than 64 bits) become uint64;
  negative, float and bool ids are refused naming the slot, the sample and the value.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch

from persia._data_ctx import DataCtx
from persia.ctx import TrainCtx
from persia.data import DataLoader, IterableDataset
from persia.embedding import EmbeddingConfig
from persia.embedding.data import (
    IDTypeFeature,
    IDTypeFeatureWithSingleID,
    Label,
    NonIDTypeFeature,
    PersiaBatch,
)
from persia.embedding.optim import SGD
from pyrsia.services.nn_worker.embedding_client import EmbeddingWorkerClient
from pyrsia.services.nn_worker.ingress import BatchQueue, Ingress
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.http_client import HttpClient, RemoteBadRequestError
from pyrsia.shared.registry import Registry, RegistrySettings
from pyrsia.shared.runtime import get_runtime
from pyrsia.shared.wire.batch import DenseArray, DensePart, IDPart
from pyrsia.shared.wire.ingress import IngressBatch
from tests.nn_helpers import PooledModel, environ, job_services

SLOT_A = """\
slots_config:
  a:
    dim: 4
"""


@pytest.fixture
def job(redis_server, tmp_path):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"bc-{uuid.uuid4().hex[:8]}"}
    with (
        environ(**env, REPLICA_INDEX="0", REPLICA_SIZE="1"),
        job_services(env, tmp_path, embedding_config=SLOT_A),
    ):
        from persia.env import reload_env

        reload_env()
        yield env
    reload_env()


# --------------------------------------------------------------------------- item 1: ownership


def test_reused_buffers_send_each_batch_its_own_ids_dense_and_labels(job):
    """One id, one dense and one label buffer refilled per batch (a common data_loader.py):
    the NN worker gets each batch's own labels and dense values, and the embedding worker
    buffered each batch's own ids (its by-reference lookup equals a direct lookup of them)."""
    n_batches, rows = 12, 16
    settings = RegistrySettings(redis_url=job["PERSIA_REDIS_URL"], job_id=job["PERSIA_JOB_ID"])
    queue = BatchQueue(n_batches, rank=0, world_size=1)
    ingress = Ingress(queue, registry_settings=settings)
    runtime = get_runtime()
    runtime.run(ingress.start())
    try:
        _send_from_reused_buffers(n_batches, rows)

        async def drain() -> list:
            return [await queue.get() for _ in range(n_batches)]

        items = runtime.run(drain())
        by_id = {item.batch_id: item for item in items}
        assert sorted(by_id) == list(range(n_batches))
        wrong_dense = [
            k
            for k, item in by_id.items()
            if not (item.dense.labels[0].data == k).all()
            or not (item.dense.non_id_type_features[0].data == k).all()
        ]
        assert wrong_dense == []
        assert runtime.run(_batches_whose_lookups_differ(runtime, settings, n_batches, rows)) == []
    finally:
        runtime.run(ingress.stop())


def _expected_ids(k: int, rows: int) -> np.ndarray:
    """Batch ``k``'s ids: ``rows`` consecutive ids from 1000 * (k + 1)."""
    return np.arange(rows, dtype=np.uint64) + np.uint64(1000 * (k + 1))


def _send_from_reused_buffers(n_batches: int, rows: int) -> None:
    """Send ``n_batches`` through a DataCtx from one id, one dense and one label buffer,
    refilled per batch (ids ``_expected_ids(k)``, dense and labels ``k``) and overwritten
    again between building each PersiaBatch and sending it."""
    ids_buf = np.empty(rows, np.uint64)
    dense_buf = np.empty((rows, 2), np.float32)
    label_buf = np.empty((rows, 1), np.float32)
    with DataCtx(max_inflight=4) as ctx:
        for k in range(n_batches):
            ids_buf[:] = _expected_ids(k, rows)
            dense_buf[:] = k
            label_buf[:] = k
            batch = PersiaBatch(
                [IDTypeFeatureWithSingleID("a", ids_buf)],
                non_id_type_features=[NonIDTypeFeature(dense_buf, name="dense")],
                labels=[Label(label_buf, name="y")],
            )
            # mutated between construction and send_data: must not leak either
            ids_buf[:] = 0
            dense_buf[:] = -1
            label_buf[:] = -1
            ctx.send_data(batch)


async def _batches_whose_lookups_differ(runtime, settings, n_batches: int, rows: int) -> list[int]:
    """The batches whose by-reference lookup (the ids the embedding worker buffered) differs
    from a direct lookup of their expected ids, or comes back all zero."""
    registry = Registry(settings)
    client = EmbeddingWorkerClient(runtime.client, registry=registry)
    try:
        await client.connect()
        await client.configure(EmbeddingConfig().to_dict())
        await client.register_optimizer(SGD(lr=0.1).to_dict())
        wrong = []
        for k in range(n_batches):
            by_ref, _ = await client.lookup(0, k, train=True, batch_size=rows)
            direct, _ = await client.lookup_direct(
                IDPart(
                    rows,
                    False,
                    (IDTypeFeatureWithSingleID("a", _expected_ids(k, rows)).to_wire(),),
                ),
                train=False,
                worker=0,
            )
            got, want = by_ref.embeddings[0][1], direct.embeddings[0][1]
            if not np.array_equal(got, want) or not np.abs(want).sum() > 0:
                wrong.append(k)
        return wrong
    finally:
        await registry.close()


def test_features_own_their_arrays():
    """Every feature keeps a read-only copy: a caller's later writes change nothing in it,
    and writing through the feature is refused instead of changing a built batch."""
    ids, tags = np.arange(4, dtype=np.uint64), [np.array([1, 2], np.uint64)] * 4
    dense, label = np.ones((4, 2), np.float32), np.zeros((4, 1), np.float32)
    batch = PersiaBatch(
        [IDTypeFeatureWithSingleID("a", ids), IDTypeFeature("t", tags)],
        non_id_type_features=[NonIDTypeFeature(dense)],
        labels=[Label(label)],
    )
    ids[:], tags[0][:], dense[:], label[:] = 9, 9, 9, 9
    single, multi = batch.id_type_features
    assert single.ids.tolist() == [0, 1, 2, 3]
    assert multi.ids.tolist() == [1, 2] * 4 and [d.tolist() for d in multi.data] == [[1, 2]] * 4
    assert (batch.non_id_type_features[0].data == 1).all() and (batch.labels[0].data == 0).all()
    for array in (single.ids, multi.ids, multi.offsets, batch.labels[0].data):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 5


def test_single_id_features_from_a_strided_column_or_in_data_name_order_are_the_same():
    """The usual uint64 case skips the checks' conversions; a strided column of a 2-D array
    and the ``(data, name)`` order PERSIA's docs show give the same owned contiguous ids."""
    table = np.arange(12, dtype=np.uint64).reshape(4, 3)
    column = table[:, 1]  # strided
    for feature in (IDTypeFeatureWithSingleID("b", column), IDTypeFeatureWithSingleID(column, "b")):
        assert feature.name == "b" and feature.ids.tolist() == [1, 4, 7, 10]
        assert feature.ids.flags.c_contiguous and not feature.ids.flags.writeable
        assert not np.shares_memory(feature.ids, table)
        assert feature.offsets.tolist() == [0, 1, 2, 3, 4]


# --------------------------------------------------------------------------- item 3: id dtypes


@pytest.mark.parametrize(
    "dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
)
def test_non_negative_integer_ids_of_any_width_become_uint64(dtype):
    values = [0, 1, 5, int(np.iinfo(dtype).max)]
    single = IDTypeFeatureWithSingleID("a", np.array(values, dtype))
    samples = [[0, 1], [], [5], [int(np.iinfo(dtype).max)]]
    multi = IDTypeFeature("t", [np.array(s, dtype) for s in samples])
    for feature in (single, multi):
        assert feature.ids.dtype == np.uint64
        assert feature.ids.tolist() == values
    assert multi.offsets.tolist() == [0, 2, 2, 3, 4]
    # the batch goes on the wire as uint64, which the worker's checks accept
    batch = PersiaBatch([single, multi], requires_grad=False)
    assert PersiaBatch.from_bytes(batch.to_bytes()).id_type_features[1].ids.tolist() == values


def test_int64_ids_cost_one_copy_and_do_not_share_the_callers_buffer():
    buf = np.arange(1024, dtype=np.int64)
    feature = IDTypeFeatureWithSingleID("a", buf)
    assert not np.shares_memory(feature.ids, buf)
    buf[:] = -1  # the caller's buffer is refilled (with what would be refused)
    assert feature.ids.tolist() == list(range(1024))


def test_mixed_signed_widths_in_one_feature_are_accepted():
    f = IDTypeFeature(
        "t", [np.array([1], np.int8), np.array([2**40], np.int64), np.array([3], np.uint32)]
    )
    assert f.ids.dtype == np.uint64 and f.ids.tolist() == [1, 2**40, 3]


def test_negative_single_ids_are_refused_naming_slot_row_and_value():
    with pytest.raises(InvalidInputError, match=r"'age'.*-7 in sample 2 \(2 negative") as e:
        IDTypeFeatureWithSingleID("age", np.array([3, 4, -7, -1], np.int64))
    assert e.value.field == "id slot 'age'"


def test_negative_ids_in_a_list_feature_name_the_sample():
    data = [np.array([1, 2], np.int32), np.array([], np.int32), np.array([4, -3], np.int32)]
    with pytest.raises(InvalidInputError, match=r"'tags'.*-3 in sample 2 "):
        IDTypeFeature("tags", data)


@pytest.mark.parametrize(
    ("array", "word"),
    [(np.array([1.0, 2.0]), "float ids"), (np.array([True, False]), "bool ids")],
)
def test_float_and_bool_ids_are_refused(array, word):
    with pytest.raises(InvalidInputError, match=word):
        IDTypeFeatureWithSingleID("a", array)
    with pytest.raises(InvalidInputError, match=rf"data\[1\].*{word}"):
        IDTypeFeature("t", [np.array([1], np.uint64), array])


def test_uint64_mixed_with_signed_samples_is_refused():
    with pytest.raises(InvalidInputError, match=r"data\[1\].*mixed"):
        IDTypeFeature("t", [np.array([2**63], np.uint64), np.array([1], np.int64)])


def test_non_arrays_and_2d_ids_are_refused():
    with pytest.raises(InvalidInputError, match=r"data\[0\].*list"):
        IDTypeFeature("t", [[1, 2]])
    with pytest.raises(InvalidInputError, match=r"shape \(2, 2\)"):
        IDTypeFeatureWithSingleID("a", np.zeros((2, 2), np.int64))


# --------------------------------------------------------------------------- item 2: finite values


def _dense_batch(dense: np.ndarray, label: np.ndarray) -> PersiaBatch:
    return PersiaBatch(
        [IDTypeFeatureWithSingleID("a", np.arange(len(label), dtype=np.uint64))],
        non_id_type_features=[
            NonIDTypeFeature(np.zeros((len(label), 1), np.float32), name="ok"),
            NonIDTypeFeature(dense, name="price"),
        ],
        labels=[Label(label)],
    )


def test_a_nan_label_is_refused_naming_the_label_and_row():
    label = np.zeros((6, 1), np.float32)
    label[3, 0] = label[5, 0] = np.nan
    with pytest.raises(InvalidInputError, match=r"row 3 \(2 of 6 rows") as e:
        _dense_batch(np.zeros((6, 2), np.float32), label)
    assert e.value.field == "labels[0] ('label_anonymous')"
    assert "nan" in str(e.value)


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_non_finite_dense_feature_is_refused_naming_it_and_row(value, dtype):
    dense = np.ones((5, 2, 3), dtype)
    dense[4, 1, 2] = value
    with pytest.raises(InvalidInputError, match=r"got -?(inf|nan) in row 4 \(1 of 5 rows") as e:
        _dense_batch(dense, np.zeros((5, 1), np.float32))
    assert e.value.field == "non_id_type_features[1] ('price')"


def test_integer_and_finite_float_parts_are_accepted():
    dense = np.full((3, 2), np.finfo(np.float32).max, np.float32)  # large but finite
    batch = _dense_batch(dense, np.zeros((3, 1), np.float32))
    assert batch.non_id_type_features[1].data.max() == np.finfo(np.float32).max
    PersiaBatch(
        [IDTypeFeatureWithSingleID("a", np.arange(3, dtype=np.uint64))],
        labels=[Label(np.array([[0], [1], [2]], np.int64))],
    )


def _ingress_body(label: np.ndarray, dense: np.ndarray, name: str | None) -> dict:
    """A dense half built without PersiaBatch, as a batch that bypasses its checks arrives."""
    part = DensePart(len(label), (DenseArray("price", dense),), (DenseArray(name, label),), None)
    return IngressBatch(loader=0, batch_id=0, worker=0, dense=part).to_wire()


@pytest.mark.parametrize(
    ("where", "field"),
    [
        ("label", "dense.labels[0].data ('click')"),
        ("dense", "dense.non_id_type_features[0].data ('price')"),
    ],
)
async def test_ingress_answers_400_naming_a_non_finite_label_or_feature(
    registry_settings, where, field
):
    queue = BatchQueue(2, rank=0, world_size=1)
    ingress = Ingress(queue, registry_settings=registry_settings)
    address = await ingress.start()
    client = HttpClient(retries=0)
    try:
        label, dense = np.zeros((4, 1), np.float32), np.zeros((4, 2), np.float64)
        (label if where == "label" else dense)[2, 0] = np.inf
        with pytest.raises(RemoteBadRequestError, match=r"row 2") as info:
            await client.call(f"http://{address}/ingress", _ingress_body(label, dense, "click"))
        assert info.value.peer_status == 400
        assert info.value.field == field
        assert len(queue) == 0  # nothing reached the training loop
    finally:
        await client.close()
        await ingress.stop()


def test_wire_check_names_an_unnamed_label_by_index():
    label = np.zeros((2, 1), np.float32)
    label[1] = np.nan
    with pytest.raises(InvalidInputError) as e:
        IngressBatch.from_wire(_ingress_body(label, np.zeros((2, 2)), None))
    assert e.value.field == "dense.labels[0].data"
    assert "row 1" in str(e.value)


# --------------------------------------------------------------------------- warnings name the cause


class _ListDataset(IterableDataset):
    def __init__(self, batches: list[PersiaBatch]):
        super().__init__(buffer_size=4)
        self.batches = batches

    def __iter__(self):
        yield from self.batches


@pytest.fixture
def train_job(redis_server, tmp_path):
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"bct-{uuid.uuid4().hex[:8]}"}
    with (
        environ(**env, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None),
        job_services(env, tmp_path, embedding_config=SLOT_A),
    ):
        yield env


def test_a_non_finite_embedding_gradient_warning_names_the_slot(train_job, caplog):
    """Labels and dense features cannot be NaN any more, so a NaN left in training comes from
    the model or the loss: the warning names the embedding slot whose gradient holds it."""
    model = PooledModel()
    batch = PersiaBatch(
        [IDTypeFeatureWithSingleID("a", np.arange(3, dtype=np.uint64))],
        labels=[Label(np.zeros((3, 1), np.float32))],
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with (
        caplog.at_level("WARNING", logger="persia.ctx"),
        TrainCtx(SGD(lr=0.1), optimizer, model=model, mixed_precision=False) as ctx,
    ):
        for training_batch in DataLoader(_ListDataset([batch]), embedding_staleness=1):
            output, _ = ctx.forward(training_batch)
            ctx.backward((output * float("nan")).sum())
    messages = [r.getMessage() for r in caplog.records if "embedding gradient" in r.getMessage()]
    assert messages and "slot(s) ['a']" in messages[0], messages
