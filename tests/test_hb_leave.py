"""Ranks leave a HybridBackend process group together.

``hb.context.destroy_process_group()`` on gloo waits for every rank before tearing its
connections down: a rank that left early (rank 0 also hosts the rendezvous store) could
make a slower peer abort in gloo's teardown with exit -6 after its work was done.
"""

from __future__ import annotations

import json

import pytest

from tests.test_hb_ddp_correct import HEADER, _start_ranks

LEAVE_SCRIPT = (
    HEADER
    + """
import time
with hb.scope():
    model = hb.wraps(Net())
optimizer = torch.optim.SGD(model.parameters(), lr=lr)
train(model, optimizer, rank, steps)
if rank == 1:
    time.sleep(2.0)  # the slow peer: still busy when rank 0 wants to leave
start = time.monotonic()
hb.context.destroy_process_group()
result["leave_s"] = time.monotonic() - start
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump(result, f)
"""
)


@pytest.mark.timeout(120)
def test_a_rank_leaving_first_waits_for_its_slower_peer(tmp_path):
    for code, err in _start_ranks(tmp_path, LEAVE_SCRIPT):
        assert code == 0, err[-4000:]
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    assert rank0["leave_s"] >= 1.5, rank0  # it met rank 1 after rank 1's 2 s
    assert rank1["leave_s"] < 1.5, rank1  # the last to arrive does not wait
