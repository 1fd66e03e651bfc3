"""The one seam between the contexts and the mode a job runs in: which :class:`Session` to open.

Services mode's session (``pyrsia.services.nn_worker.session``) talks to embedding workers
over HTTP; embedded mode's (``$PERSIA_EMBEDDED=1``) calls the engines in this process. The
choice lives here, above both, so the NN worker never imports embedded mode and the engines
are imported only when a job asks for them.
"""

from __future__ import annotations

from pyrsia.services.embedded.mode import embedded_requested
from pyrsia.services.nn_worker.session import Session
from pyrsia.shared.constants import DEFAULT_WAIT_TIMEOUT_S
from pyrsia.shared.settings import Settings


def open_session(
    settings: Settings,
    *,
    addresses: list[str] | None = None,
    wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
) -> Session:
    """A registry-backed (``addresses=None``) or fixed-address session; with
    ``PERSIA_EMBEDDED=1`` and no addresses, the in-process engines' session instead.
    ``settings``: the process's, from the context that opens it."""
    if addresses is None and embedded_requested(settings.environ):
        from pyrsia.services.embedded.job import EmbeddedSession  # engines: only here

        return EmbeddedSession.open(settings, wait_timeout_s=wait_timeout_s)
    return Session.open(settings, addresses=addresses, wait_timeout_s=wait_timeout_s)
