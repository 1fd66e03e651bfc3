"""The training-side runtime that runs inside the user's process (private).

``train.py`` and ``data_loader.py`` run Pyrsia's client code in their own processes:
the event-loop thread (``runtime``), the NN worker's batch ingress, the embedding
prefetch, the asynchronous gradient return, the dense checkpoint, and what shows a rank
from outside (``rank_stats``: its ``/metrics``; ``tensorboard``: its curves). None of it is a
server of its own, so it lives here, under ``persia``, and depends only on ``shared``.
"""
