"""Host one NN-worker batch ingress in its own process, as a train.py rank does.

``python -m tests.faults.ingress_host [--rank R --world-size W --capacity C]`` starts the
real :class:`pyrsia.services.nn_worker.ingress.Ingress` (registered as ``nn_worker/<rank>``) and
consumes batches as a training loop would, until SIGTERM; it exits 0 after stopping
the ingress. The fuzz and load suites use it so a crash of the ingress is a dead
process they can see, not an exception swallowed inside pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from pyrsia.services.nn_worker.ingress import BatchQueue, Ingress
from pyrsia.shared.registry_settings import RegistrySettings
from pyrsia.shared.settings import current

log = logging.getLogger(__name__)


async def serve(rank: int, world_size: int, capacity: int) -> None:
    queue = BatchQueue(capacity, rank=rank, world_size=world_size)
    settings = current()  # this helper process's entry point
    ingress = Ingress(queue, registry_settings=RegistrySettings.from_env(settings))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def consume() -> None:
        while await queue.get() is not None:
            pass

    await ingress.start()
    consumer = asyncio.create_task(consume())
    try:
        await stop.wait()
    finally:
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        await ingress.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--capacity", type=int, default=64)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    asyncio.run(serve(args.rank, args.world_size, args.capacity))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
