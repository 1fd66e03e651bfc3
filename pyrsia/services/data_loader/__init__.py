"""The data loader: runs the user's ``data_loader.py`` and sends its batches into the job.

``persia-launcher data-loader data_loader.py --replica-index i --replica-size n`` (or
``python -m pyrsia.services.data_loader``, same flags) sets ``REPLICA_INDEX`` /
``REPLICA_SIZE``, takes this replica's slot in the job, and runs the script as
``__main__``. The script builds ``PersiaBatch`` es and hands them to ``DataCtx``
(``persia.ctx``), the facade over :class:`~pyrsia.services.data_loader.sender.BatchSender`:
each batch's id features go to an embedding worker, its dense half and the reference
to one NN-worker rank (PERSIA's data-flow steps 1 and 2).

Threads of one data-loader process::

    main thread (the user's data_loader.py)          event-loop thread (Runtime)
    ─────────────────────────────────────            ───────────────────────────────
    build PersiaBatch ──DataCtx.send_data──┐
      (blocks only while max_inflight      └──submit──> send: POST /batch  -> embedding worker
       sends are under way)                                  POST /ingress -> NN-worker rank
    build the next batch ...                                 (429: back off and retry)
    leave `with DataCtx()` ──finish──────────────────> POST /done to every rank
                                                       (ends the ranks' StreamingDataset)
    SIGTERM handler: stop taking batches, exit 0

Modules: ``sender`` (the network side), ``launch`` (the command line, slot, signals).
"""
