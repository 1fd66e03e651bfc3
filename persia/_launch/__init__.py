"""Entry points of the ``persia-launcher`` subcommands that are not a service's own (private).

``run`` (a whole job on one machine), ``serve``, ``status`` and ``prometheus-targets``
live here. Each service's entry point stays with its service:
``pyrsia.services.embedding_ps.main``, ``pyrsia.services.embedding_worker.main``,
``pyrsia.services.nn_worker.launch`` (train.py on N ranks through torch's own launcher)
and ``pyrsia.services.data_loader.launch`` (data_loader.py as one replica; its
``persia-launcher`` entry is :mod:`persia._launch.data_loader`).
"""
