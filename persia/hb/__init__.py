"""HybridBackend's distributed-training API on Pyrsia's NN workers (``import persia.hb as hb``).

=============================================  ==================================================
HybridBackend                                  here
=============================================  ==================================================
``python -m hybridbackend.run python main.py``  ``python -m persia.hb.run python train.py``
``hb.context.rank / world_size / local_rank``  the same (from torch's launcher environment)
``hb.context.options.<name>`` / ``HB_<NAME>``  the same; typed, validated, typos refused
``hb.scope(**options)`` / ``hb.function(...)``  the same; dense parameters made there are
                                               data parallel; ``grad_nbuckets`` -> buckets
``hb.scope(sharding=True)`` (embedding_scope)  torch Embedding/EmbeddingBag on the embedding PS
``hb.wraps(Optimizer)``                        the same for torch optimizers (and modules: DDP)
``hb.data.make_one_shot_iterator`` etc.        over a torch Dataset, each rank its share
``hb.metrics.auc / accuracy``                  streaming, exact across ranks
``hb.train.EvaluationHook(eval_fn, every_n)``  ``hb.train.train_and_evaluate(eval_every_n_iter=)``
``hb.train.export(dir, checkpoint, ...)``      the Pyrsia serving artifact (persia.serving)
=============================================  ==================================================

Data parallel, with several ranks, means what it means in HybridBackend: a dense
parameter made under ``hb.scope`` (or ``hb.function``), wrapped by ``hb.wraps(module)``,
or stepped by an ``hb.wraps`` optimizer starts from rank 0's value (buffers too, where
the module is known) and is trained with the mean of the ranks' gradients, all-reduced
in ``grad_nbuckets`` buckets: during backward by DDP, or in ``optimizer.step()`` with
``grad_lazy_sync`` or for a plain torch optimizer stepping parameters made in the scope
(see :mod:`persia.hb._parallel`).

The gradients of ``hb.scope(sharding=True)`` tables are averaged over the ranks as
HybridBackend averages them (``GradientAggregation._reduce`` scales by ``1 / world_size``):
each rank's gradient reaches the PS divided by the world size. The option
``emb_grad_reduction="sum"`` applies them as sent, summed over the ranks (PERSIA's rule,
``TrainCtx(embedding_grad_reduction=)``'s default).
"""

from __future__ import annotations

from persia.hb import data, embedding, metrics, train
from persia.hb._context import Context, context
from persia.hb._options import Options
from persia.hb._scope import function, scope, wraps

__all__ = [
    "Context",
    "Options",
    "context",
    "data",
    "embedding",
    "function",
    "metrics",
    "scope",
    "train",
    "wraps",
]
