"""Entry points of the ``persia-launcher`` subcommands that run user scripts (private).

``nn_worker`` starts train.py on N ranks through torch's own launcher;
``data_loader`` runs data_loader.py as one replica. The two servers' entry points
stay with their services (``pyrsia.services.embedding_ps.main``, ``pyrsia.services.embedding_worker.main``).
"""
