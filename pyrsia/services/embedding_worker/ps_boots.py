"""Which PS replica processes the worker has trained on, to catch one restarted empty.

Every Train PS process draws a random boot id when it starts and says whether it loaded a
checkpoint since (``/health``, and the answers of ``/configure``, ``/register_optimizer``,
``/load``, ``/clear`` and ``/stats``: ``boot_id``, ``loaded``). A supervisor
(docker ``restart: on-failure``, a pod restart) may start a killed replica again on the same
index: it comes back empty, and training on would silently use re-initialized rows for every
id it held. The rule, per replica:

- a replica *holds job state* once the worker sent it a training lookup or an update, or
  loaded a checkpoint into it (``/load``);
- a different boot id on a replica that holds job state, from a process that loaded no
  checkpoint, means it restarted empty: the replica is marked lost, and every ``/lookup``,
  ``/update`` and ``/dump`` touching it is refused (409, naming it and saying to resume from
  the last checkpoint); the worker asks the replica again before each refusal;
- a new process that loaded a checkpoint (a resume's ``/load``, sent through any worker)
  is the one the job goes on with: it is known from then on and the mark is cleared;
- a different boot id on a replica that held nothing yet (a fresh job, eval lookups only)
  is simply the new process: it is configured again and the job goes on;
- ``/load`` (a resume) or ``/clear`` through the worker makes what every replica answers the
  known process again and clears the mark.

A Redis restart changes no boot id (the PS re-registers the same process), so it never trips.
"""

from __future__ import annotations

from pyrsia.shared.errors import PSRestartedEmptyError

REFUSED_WHEN_LOST = frozenset({"/lookup", "/update", "/dump"})
"""Routes refused for a lost replica: they would read, train or checkpoint its empty rows."""

REBASELINE = frozenset({"/load", "/clear"})
"""Fan-outs after which every replica's answering process is the known one."""


class ReplicaBoots:
    """Per PS replica: the boot id last seen, whether it holds job state, and a lost mark."""

    def __init__(self) -> None:
        self.seen: dict[int, str] = {}
        self.holds: set[int] = set()
        self.lost: dict[int, str] = {}

    def check(self, index: int, path: str) -> None:
        """Raise ``PSRestartedEmptyError`` when ``path`` would touch a lost replica."""
        if index in self.lost and path in REFUSED_WHEN_LOST:
            raise PSRestartedEmptyError(self.lost[index])

    def hold(self, index: int) -> None:
        """Replica ``index`` now holds job state (a training lookup or an update was sent)."""
        self.holds.add(index)

    def refuses(self, index: int, path: str) -> bool:
        """Whether ``path`` to replica ``index`` would be refused now (it is marked lost)."""
        return index in self.lost and path in REFUSED_WHEN_LOST

    def observe(self, index: int, answer: object, path: str, url: str) -> bool:
        """Note the process (``boot_id``, ``loaded``) replica ``index`` answered ``path`` as;
        True when it is marked lost (another process than the one holding job state, with no
        checkpoint loaded)."""
        boot_id = answer.get("boot_id") if isinstance(answer, dict) else None
        if not isinstance(boot_id, str) or not boot_id:
            return False  # an Infer PS sends none: nothing to compare
        known = self.seen.get(index)
        if path in REBASELINE or (boot_id != known and answer.get("loaded") is True):
            self.seen[index] = boot_id  # a resume loaded it (through this or another worker)
            self.lost.pop(index, None)
            self.holds.discard(index)
            if path != "/clear":
                self.holds.add(index)
            return False
        if known is None or known == boot_id or index not in self.holds:
            if index not in self.lost:
                self.seen[index] = boot_id
            return False
        if index not in self.lost:
            self.lost[index] = (
                f"PS replica {index} restarted empty (at {url}, boot id {known} -> {boot_id}): "
                "the embedding rows it held are lost, and training on would use re-initialized "
                "rows. Stop the job and resume it from the last checkpoint (--resume), which "
                "loads the checkpoint into every PS replica."
            )
        return True
