"""No service imports another service, except embedded mode's room (DESIGN.md).

Each folder of ``pyrsia/services`` is one process's machinery. Embedded mode
(``pyrsia/services/embedded/``) is the one room that composes other services' engines; the
NN worker reaches it only through ``persia``. Imports inside functions count, read with
``ast`` by :func:`tests.test_layering.import_graph`.
"""

from __future__ import annotations

from tests.test_layering import import_graph, reachable

SERVICE_IMPORTS_ALLOWED: dict[str, set[str]] = {
    "embedded": {"embedding_ps", "embedding_worker", "nn_worker"},
    "warmup": {"embedded"},
}
"""Room -> the other service rooms it may import (lazy imports counted). Embedded mode
(``pyrsia/services/embedded/``) composes the PS and embedding-worker engines in the NN
worker's process, so it is the one room that imports them (and the NN worker's session and
batch queue it runs in); ``pyrsia/services/warmup.py`` is only the ``python -m
pyrsia.services.warmup`` entry point of its kernel warm-up. Nothing else crosses: the NN
worker reaches embedded mode through ``persia`` (``persia._session_open``,
``persia._data_ctx``)."""

KNOWN_SERVICE_IMPORTS: set[tuple[str, str]] = set()
"""Service-to-service imports main still has, each to be removed. This set may only shrink:
a new one fails, and so does an entry no import needs any more (delete it)."""


def _service_room(module: str) -> str | None:
    """``pyrsia.services.nn_worker.step`` -> ``nn_worker``; ``pyrsia.services.warmup`` ->
    ``warmup``; None outside ``pyrsia.services`` and for the package itself."""
    parts = module.split(".")
    if parts[:2] != ["pyrsia", "services"] or len(parts) < 3:
        return None
    return parts[2]


def service_to_service_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) modules of two different service rooms."""
    found = set()
    for module, imported in graph.items():
        room = _service_room(module)
        for other in imported:
            other_room = _service_room(other)
            if room and other_room and other_room != room:
                found.add((module, other))
    return found


def test_no_service_imports_another_service_but_the_embedded_room() -> None:
    crossing = service_to_service_imports(import_graph(lazy=True))
    allowed = {
        (a, b)
        for a, b in crossing
        if _service_room(b) in SERVICE_IMPORTS_ALLOWED.get(_service_room(a) or "", set())
    }
    new = sorted(crossing - allowed - KNOWN_SERVICE_IMPORTS)
    assert not new, "a service imports another service:\n" + "\n".join(
        f"{a} -> {b}" for a, b in new
    )
    stale = sorted(KNOWN_SERVICE_IMPORTS - crossing)
    assert not stale, f"these imports are gone: delete them from KNOWN_SERVICE_IMPORTS: {stale}"


def test_the_service_import_rule_sees_a_crossing() -> None:
    graph = {
        "pyrsia.services.nn_worker.a": {"pyrsia.services.embedding_ps.engine", "pyrsia.shared.x"},
        "pyrsia.services.embedded.job": {"pyrsia.services.nn_worker.a"},
        "pyrsia.services.nn_worker.b": {"pyrsia.services.nn_worker.a", "pyrsia.services"},
    }
    assert service_to_service_imports(graph) == {
        ("pyrsia.services.nn_worker.a", "pyrsia.services.embedding_ps.engine"),
        ("pyrsia.services.embedded.job", "pyrsia.services.nn_worker.a"),
    }


def test_the_nn_worker_never_imports_embedded_mode() -> None:
    """Embedded mode's engines load only when a job asks for them: nothing the NN worker's
    files import, lazy imports included, is in the embedded room or the engines."""
    graph = import_graph(lazy=True)
    reached = set()
    for module in graph:
        if _service_room(module) == "nn_worker":
            reached |= reachable(graph, module)
    rooms = {_service_room(m) for m in reached}
    assert not rooms & {"embedded", "embedding_ps", "embedding_worker"}
