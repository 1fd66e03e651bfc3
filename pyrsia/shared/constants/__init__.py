"""Every registry key, TTL, default port, size cap and timeout Pyrsia uses, in one place.

Nothing else in the code base spells a Redis key or picks a timeout by itself: it
imports the value from here, so the whole protocol surface can be read at once. The
values live in one module per topic, and every name is imported from the package
(``from pyrsia.shared.constants import X``)::

    env_names   the environment variables' names (ENV_*)
    discovery   the registry's Redis keys, registration TTLs, discovery waits, service roles
    network     the wire's formats and caps, HTTP timeouts, retries, default ports
    processes   the in-process runtime, launchers, helpers and observers: timeouts, intervals
    limits      the largest batches and tables, inline work, the pipeline's bounds

A new constant goes into the module of its topic; this package re-exports it.
"""

from pyrsia.shared.constants.discovery import *  # noqa: F403
from pyrsia.shared.constants.env_names import *  # noqa: F403
from pyrsia.shared.constants.limits import *  # noqa: F403
from pyrsia.shared.constants.network import *  # noqa: F403
from pyrsia.shared.constants.processes import *  # noqa: F403
