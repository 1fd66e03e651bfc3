"""The NN worker: the runtime around the user's ``train.py`` on every training rank.

``persia-launcher nn-worker train.py --nproc-per-node N`` (or
``python -m pyrsia.services.nn_worker train.py ...``, same flags; ``launch``) starts N
ranks through torch's own launcher; each runs ``rank_entry``, which runs the script as
``__main__``. Everything a rank does besides the user's code lives here, behind the
``persia`` facade (``TrainCtx``, ``DataLoader``): the batch ingress the data loaders push
to (``ingress``), the path of a batch (``lookups``: where batches come from and how
each is looked up through the ``embedding_client``; ``prefetch``: ahead of the loop), the
training step and its hooks (``step``), the asynchronous
gradient return (``backward``) with its bounds (``inflight``), even steps across ranks
(``even_steps``), precision (``precision``), periodic and job checkpoints
(``checkpointer``, ``dense_state``; the job checkpoint's layout is
``pyrsia.shared.job_checkpoint``), and what shows a rank from
outside (``rank_stats``: ``/metrics``; ``tensorboard``; ``step_clock``).

Threads of one rank::

    training thread (train.py)                 event-loop thread (runtime.Runtime)
    ──────────────────────────                 ─────────────────────────────────────────
    for batch in DataLoader(...):              ingress: POST /ingress, /done, GET /metrics
      <── ready batch (thread-safe queue) ───     └─> BatchQueue (bounded; 429 when full)
      ctx.forward(batch)                       prefetch.Prefetcher: queue -> lookup at the
        step hooks: before_forward                embedding worker (num_workers in flight),
      loss = ...                                  tensors built here, in source order
      ctx.backward(loss) = TrainingStep.run:   backward.BackwardEngine: gradients to the
        autograd ─> after_backward                embedding worker (backward_buffer_size
        embedding grads ─submit──────────────>    batches in flight = staleness bound)
        before_dense_step ─> optimizer.step    registry heartbeat (Redis lease)
          (DDP all-reduce: gloo/nccl threads)
        after_dense_step ─> step_boundary      tensorboard writer thread (when asked for)
          (periodic checkpoint, stats)         "pyrsia-dataset" thread: reads an
                                                 IterableDataset ahead of the lookups
    SIGTERM (termination): SystemExit(0) in the loop; leaving the context drains the
      in-flight gradients; exit 0 (a watchdog ends a stuck exit)
"""
