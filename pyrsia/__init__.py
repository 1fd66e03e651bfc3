"""Pyrsia's machinery: the four services (``pyrsia.services``) and their common code
(``pyrsia.shared``). Users import ``persia``, PERSIA's API; this package is what runs it.

Dependency rule: ``persia -> pyrsia.services.* -> pyrsia.shared``. Importing this package
imports nothing else, so a service process starts without torch.
"""
