"""The first job's data loader: sends the training batches into the job.

``persia-launcher run`` (or ``persia-launcher data-loader``) runs it. With several data
loaders, replica ``i`` of ``n`` sends batches ``i, i + n, i + 2n, ...``, so together they
send each batch once.
"""

from clicks import batches
from tqdm import tqdm

from persia.ctx import DataCtx
from persia.env import get_replica_index, get_replica_size

TRAIN_BATCHES = 150

with DataCtx() as ctx:
    index, size = get_replica_index(), get_replica_size()
    mine = len(range(index, TRAIN_BATCHES, size))
    for batch in tqdm(batches(index, mine, step=size), total=mine, desc="send"):
        ctx.send_data(batch)
