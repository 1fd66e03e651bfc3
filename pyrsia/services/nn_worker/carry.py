"""Embedding gradients carried on the next ``/lookup`` instead of their own ``/gradients``.

Each trained batch used to cost two requests to the embedding worker: ``/lookup`` before the
step and ``/gradients`` after it. A :class:`GradientCarrier` keeps a batch's gradients (as the
``Gradients`` body ``/gradients`` would send) until the next lookup to the same worker
starts; that lookup carries them, the worker applies them first, in order, and its answer
says what each did (PROTOCOL.md, ``/lookup``). One request and one answer fewer per batch,
and on the worker one PS round trip per batch fewer to wait for in turn.

The staleness bound keeps its meaning: a batch's permit comes back when its gradients are
handed to the carrier, and the lookup that the permit then admits applies them before it
reads any embedding; a lookup to another worker first waits for the gradients kept for the
others, sent alone. Gradients that no lookup takes within ``wait_s`` (the stream paused or
ended), that a flush asks for, or whose carrying lookup failed or was cancelled, go alone
on ``/gradients``: the worker applies each batch's gradients at most once (it forgets the
batch when it applies them; a second copy is answered 404).

Lives on the runtime loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pyrsia.shared.constants import MAX_CARRIED_GRADIENTS
from pyrsia.shared.errors import ProtocolError
from pyrsia.shared.wire.worker import Gradients, GradientsApplied

Waiting = list[tuple[Gradients, asyncio.Future]]
SendAlone = Callable[[int, Gradients], Awaitable[GradientsApplied]]


class GradientCarrier:
    """Gradients waiting, per embedding worker, for the next lookup to carry them."""

    def __init__(self, send_alone: SendAlone, wait_s: float):
        """``send_alone(worker, request)``: the ``/gradients`` call for what no lookup takes;
        ``wait_s``: how long gradients wait for a lookup before they go alone."""
        self._send_alone = send_alone
        self.wait_s = wait_s
        self.hold = True
        """False while flushing: offered gradients go alone at once."""
        self._waiting: dict[int, Waiting] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._sends: set[asyncio.Task] = set()
        self.carried = 0
        """Gradient bodies a lookup carried."""
        self.alone = 0
        """Gradient bodies sent alone on ``/gradients``."""

    def offer(self, worker: int, request: Gradients) -> asyncio.Future[GradientsApplied]:
        """Keep ``request`` for the next lookup to ``worker``; the future gets what applying
        it did (or the error that kept it from being applied)."""
        future: asyncio.Future[GradientsApplied] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(worker, [])
        waiting.append((request, future))
        if not self.hold or len(waiting) >= MAX_CARRIED_GRADIENTS:
            self.send_alone(worker)
        elif worker not in self._timers:
            loop = asyncio.get_running_loop()
            self._timers[worker] = loop.call_later(self.wait_s, self.send_alone, worker)
        return future

    def take(self, worker: int) -> Waiting:
        """The gradients kept for ``worker``, for a lookup to carry (none are kept after)."""
        timer = self._timers.pop(worker, None)
        if timer is not None:
            timer.cancel()
        return self._waiting.pop(worker, [])

    def send_alone(self, worker: int | None = None) -> list[asyncio.Future]:
        """Send what is kept for ``worker`` (None: for every worker) on ``/gradients``; the
        futures of what went."""
        workers = list(self._waiting) if worker is None else [worker]
        futures = []
        for w in workers:
            for request, future in self.take(w):
                task = asyncio.create_task(self._send(w, request, future))
                self._sends.add(task)
                task.add_done_callback(self._sends.discard)
                futures.append(future)
        return futures

    async def before_lookup(self, worker: int) -> Waiting:
        """What a lookup to ``worker`` carries; first, the gradients kept for any other
        worker are sent alone and applied (the lookup must not read before them)."""
        others = self.send_alone_except(worker)
        if others:
            await asyncio.wait(others)
        carried = self.take(worker)
        self.carried += len(carried)
        return carried

    def send_alone_except(self, worker: int) -> list[asyncio.Future]:
        futures = []
        for w in [w for w in self._waiting if w != worker]:
            futures += self.send_alone(w)
        return futures

    def answered(self, carried: Waiting, applied: tuple[GradientsApplied, ...]) -> None:
        """The carrying lookup's answer: each carried body's result."""
        if len(applied) != len(carried):
            exc = ProtocolError(
                f"embedding worker answered {len(applied)} 'applied' entries for "
                f"{len(carried)} carried gradient bodies"
            )
            for _, future in carried:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(carried, applied, strict=True):
            if not future.done():
                future.set_result(result)

    def failed(self, worker: int, carried: Waiting) -> None:
        """The carrying lookup failed or was cancelled: its gradients go alone (any the
        worker applied before the failure are answered 404 there, never applied twice)."""
        if carried:
            self._waiting.setdefault(worker, [])[:0] = carried
            self.send_alone(worker)

    async def _send(self, worker: int, request: Gradients, future: asyncio.Future) -> None:
        self.alone += 1
        try:
            result = await self._send_alone(worker, request)
        except asyncio.CancelledError:
            if not future.done():
                future.cancel()
            raise
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(result)

    async def close(self) -> None:
        """Send everything kept, and wait for the sends."""
        self.send_alone()
        while self._sends:
            await asyncio.gather(*list(self._sends), return_exceptions=True)
