"""hb.scope(sharding=True): torch Embedding / EmbeddingBag tables on the embedding PS.

Real services: a redis-server, one PS replica and one embedding worker; the modules'
lookups go to `/lookup_direct` and their gradients to `/gradients`.
"""

from __future__ import annotations

import uuid

import pytest
import torch
from torch import nn

import persia.hb as hb
from persia.embedding import EmbeddingConfig
from persia.embedding.optim import SGD
from persia.hb.embedding import ShardedEmbedding, ShardedEmbeddingBag
from pyrsia.shared.errors import ConfigError, InvalidInputError
from tests.hb_helpers import reset_hb
from tests.nn_helpers import job_services

CONFIG = """\
slots_config:
  user:
    dim: 4
  item:
    dim: 4
  wide:
    dim: 3
  scaled:
    dim: 4
    sqrt_scaling: true
  raw:
    dim: 4
    embedding_summation: false
"""


@pytest.fixture(scope="module")
def services(redis_server, tmp_path_factory):
    """One PS and one embedding worker for the whole module (tests use disjoint ids)."""
    env = {"PERSIA_REDIS_URL": redis_server.url, "PERSIA_JOB_ID": f"hb-{uuid.uuid4().hex[:8]}"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        with job_services(env, tmp_path_factory.mktemp("svc"), embedding_config=CONFIG):
            yield env


@pytest.fixture
def ps(services):
    reset_hb()
    hb.context.options.embedding_optimizer = SGD(lr=1.0)
    hb.context.options.embedding_config = EmbeddingConfig(emb_initialization=(-0.5, 0.5))
    hb.context.options.emb_staleness = 0  # each gradient applied before the next lookup
    yield
    reset_hb()


class TwoTables(nn.Module):
    def __init__(self, mode: str = "sum"):
        super().__init__()
        self.user = nn.EmbeddingBag(1000, 4, mode=mode)
        self.item = nn.Embedding(1000, 4, padding_idx=0)


def _rows(ids: list[int], slot: str = "user") -> torch.Tensor:
    """The PS rows of ``ids`` now (an eval lookup through a one-id-per-bag Embedding)."""
    with hb.scope(sharding=True):
        probe = nn.Embedding(1000, 4)
    probe.slot = slot
    with torch.no_grad():
        return probe.eval()(torch.tensor(ids))


def test_modules_in_the_scope_are_sharded_and_hold_no_table():
    with hb.scope(sharding=True):
        model = TwoTables()
        huge = nn.EmbeddingBag(10**12, 16)  # 64 TB as a local table; nothing is allocated
        child = nn.ModuleDict({"clicks": nn.Embedding(10, 4)})
    outside = nn.Embedding(10, 4)
    assert isinstance(model.user, ShardedEmbeddingBag) and isinstance(model.user, nn.EmbeddingBag)
    assert isinstance(model.item, ShardedEmbedding) and isinstance(model.item, nn.Embedding)
    assert (model.user.slot, model.item.slot, child["clicks"].slot) == ("user", "item", "clicks")
    assert isinstance(huge, ShardedEmbeddingBag) and huge.slot is None
    assert list(model.parameters()) == [] and model.state_dict() == {}
    assert type(outside) is nn.Embedding and outside.weight.shape == (10, 4)
    with pytest.raises(AttributeError, match="no local weight: its rows live on the embedding"):
        model.user.weight  # noqa: B018
    with pytest.raises(InvalidInputError, match="no preset table inside hb.scope"):
        with hb.scope(sharding=True):
            nn.Embedding.from_pretrained(torch.zeros(3, 4))
    with hb.scope(sharding=False):
        assert type(nn.Embedding(3, 4)) is nn.Embedding


def test_bag_forward_sums_ps_rows_and_backward_updates_them(ps):
    with hb.scope(sharding=True):
        model = TwoTables()
    ids = torch.tensor([[1, 2], [2, 3]])
    model.user(ids).sum().mul(0).backward()  # inserts rows 1..3 with a zero update
    before = _rows([1, 2, 3])
    assert before.abs().max() > 0
    out = model.user(ids)
    torch.testing.assert_close(out, torch.stack([before[0] + before[1], before[1] + before[2]]))
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0])
    (out * weights).sum().backward()  # d out / d rows: each bag's gradient is `weights`
    hb.train.flush()
    after = _rows([1, 2, 3])
    expected = before - torch.stack([weights, 2 * weights, weights])  # SGD, lr 1; id 2 twice
    torch.testing.assert_close(after, expected, rtol=1e-5, atol=1e-5)


def test_offsets_mean_mode_and_padding_follow_torch_semantics(ps):
    with hb.scope(sharding=True):
        model = TwoTables(mode="mean")
    ids = torch.tensor([105, 106, 107, 108, 109])
    model.user(ids, torch.tensor([0, 2])).sum().mul(0).backward()  # insert the rows
    rows = _rows(ids.tolist())
    model.eval()
    with torch.no_grad():
        mean = model.user(ids, torch.tensor([0, 2]))
        torch.testing.assert_close(mean, torch.stack([rows[:2].mean(0), rows[2:].mean(0)]))
        last = model.user(ids, torch.tensor([0, 1, 4]), None)  # 3 bags, the last to the end
        assert last.shape == (3, 4)
        model.user.include_last_offset = True
        only_two = model.user(ids, torch.tensor([0, 1, 3]))  # id 9 is after the last offset
        torch.testing.assert_close(only_two[1], rows[1:3].mean(0))
        empty = model.user(torch.zeros(2, 0, dtype=torch.long))
        torch.testing.assert_close(empty, torch.zeros(2, 4))
        model.item.train()
    item_ids = torch.tensor([[0, 105], [106, 0]])  # 0 is padding_idx: zero, no gradient
    out = model.item(item_ids)
    assert out.shape == (2, 2, 4)
    torch.testing.assert_close(out[0, 0], torch.zeros(4))
    torch.testing.assert_close(out[1, 1], torch.zeros(4))
    out.sum().mul(0).backward()
    item_rows = _rows([105, 106], slot="item")
    torch.testing.assert_close(out[0, 1].detach(), item_rows[0])
    torch.testing.assert_close(out[1, 0].detach(), item_rows[1])


def test_eval_lookups_do_not_insert_or_train(ps):
    with hb.scope(sharding=True):
        model = TwoTables()
    model.eval()
    with torch.no_grad():
        out = model.user(torch.tensor([[40, 41]]))
    torch.testing.assert_close(out, torch.zeros(1, 4))  # never seen: not inserted
    model.train()
    out = model.user(torch.tensor([[40, 41]]))
    assert out.abs().sum() > 0  # a training lookup inserts


def test_slot_mismatches_are_refused_with_what_to_fix(ps):
    with hb.scope(sharding=True):
        user_wrong_dim = nn.EmbeddingBag(10, 8)
        usr = nn.EmbeddingBag(10, 4)
        scaled = nn.EmbeddingBag(10, 4)
        raw = nn.Embedding(10, 4)
        nameless = nn.Embedding(10, 4)
        maxed = nn.EmbeddingBag(10, 4, mode="max")
        ok = nn.EmbeddingBag(10, 4, mode="sum")
    user_wrong_dim.slot, usr.slot, scaled.slot, raw.slot, ok.slot = (
        "user",
        "usr",
        "scaled",
        "raw",
        "user",
    )
    ids = torch.tensor([[1, 2]])
    with pytest.raises(InvalidInputError, match=r"slots_config.user.dim: expected 8"):
        user_wrong_dim(ids)
    with pytest.raises(ConfigError, match=r'unknown slot "usr".*did you mean'):
        usr(ids)
    with pytest.raises(InvalidInputError, match="sqrt_scaling"):
        scaled(ids)
    with pytest.raises(InvalidInputError, match="embedding_summation"):
        raw(torch.tensor([1]))
    with pytest.raises(InvalidInputError, match=r"\.slot: expected the embedding-worker slot name"):
        nameless(torch.tensor([1]))
    with pytest.raises(InvalidInputError, match="'sum' or 'mean'"):
        maxed(ids)
    with pytest.raises(InvalidInputError, match=r"input: expected ids in \[0, num_embeddings=10\)"):
        ok(torch.tensor([[1, 10]]))
    with pytest.raises(InvalidInputError, match="integer tensor"):
        ok(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(InvalidInputError, match="per_sample_weights"):
        ok(torch.tensor([1, 2]), torch.tensor([0]), torch.ones(2))
    with pytest.raises(InvalidInputError, match="offsets: expected non-decreasing"):
        ok(torch.tensor([1, 2]), torch.tensor([1]))


def test_without_an_embedding_optimizer_the_first_lookup_says_what_to_set():
    reset_hb()
    with hb.scope(sharding=True):
        model = TwoTables()
    with pytest.raises(ConfigError, match="no embedding optimizer"):
        model.user(torch.tensor([[1]]))
    reset_hb()


def test_hb_wraps_sgd_becomes_the_ps_optimizer(services):
    reset_hb()
    try:
        with hb.scope(sharding=True, emb_staleness=0):
            model = TwoTables()
        opt = hb.wraps(torch.optim.SGD)([torch.nn.Parameter(torch.zeros(1))], lr=0.25)
        assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "HBSGD"
        ids = torch.tensor([[311]])
        model.user(ids).sum().mul(0).backward()
        before = _rows([311])
        model.user(ids).sum().backward()  # gradient 1 per component
        hb.train.flush()
        torch.testing.assert_close(_rows([311]), before - 0.25, rtol=1e-5, atol=1e-6)
    finally:
        reset_hb()
