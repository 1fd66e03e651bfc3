"""All-reduce timing between two hosts: ``python tests/cluster/gloo_probe.py MASTER RANK``.

Each rank joins a gloo process group (rendezvous ``tcp://MASTER:PORT``, sockets on the
host's ``eth0``, as ``GLOO_SOCKET_IFNAME`` makes the NN-worker ranks do) and times
``--iterations`` all-reduces of ``--floats`` float32 values; rank 0 prints one JSON line:
``{"p50_ms": ..., "p90_ms": ..., "floats": ..., "iterations": ...}`` (the first tenth is
warm-up and left out). Used by the harness to show that a delayed link
(:meth:`tests.cluster.netns.Network.delay`) delays gloo's traffic between ranks.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

PORT = 29511


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("master", help="rank 0's host name")
    parser.add_argument("rank", type=int, choices=(0, 1))
    parser.add_argument("--floats", type=int, default=4096)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--port", type=int, default=PORT)
    args = parser.parse_args(argv)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master}:{args.port}",
        rank=args.rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    tensor = torch.ones(args.floats)
    times = []
    for _ in range(args.iterations):
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append((time.perf_counter() - start) * 1e3)
    dist.barrier()
    dist.destroy_process_group()
    kept = sorted(times[args.iterations // 10 :])
    if args.rank == 0:
        print(
            json.dumps(
                {
                    "p50_ms": round(statistics.median(kept), 3),
                    "p90_ms": round(kept[int(len(kept) * 0.9)], 3),
                    "floats": args.floats,
                    "iterations": args.iterations,
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
