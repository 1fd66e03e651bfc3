"""``persia-launcher``: one command for every Pyrsia service, PERSIA's subcommands and flags.

::

    persia-launcher embedding-parameter-server --embedding-config F --global-config F \\
        --replica-index i --replica-size n --port p
    persia-launcher embedding-worker           (same flags)
    persia-launcher nn-worker train.py --nproc-per-node N --nnodes M --node-rank R
    persia-launcher data-loader data_loader.py --replica-index i --replica-size n
    persia-launcher run --nn-worker train.py --data-loader data_loader.py \\
        --embedding-config F --global-config F     (the whole job on this machine)
    persia-launcher serve --model <export dir> --embedding-config F --global-config F --port p
    persia-launcher status [--watch]                 (every process of a running job)
    persia-launcher prometheus-targets [--watch --output F]   (Prometheus file_sd targets)
    persia-launcher convert-checkpoint --persia-dir D --output O --optimizer JSON

Files fall back to ``PERSIA_EMBEDDING_CONFIG``, ``PERSIA_GLOBAL_CONFIG``,
``PERSIA_NN_WORKER_ENTRY`` and ``PERSIA_DATALOADER_ENTRY``; the registry is
``PERSIA_REDIS_URL`` / ``PERSIA_JOB_ID``; ``LOG_LEVEL`` sets the log level. A
missing file or an unreachable Redis is one line on stderr and exit code 2.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "embedding-parameter-server": (
        "pyrsia.services.embedding_ps.main",
        "the embedding parameter server (a shard of the embedding tables)",
    ),
    "embedding-worker": (
        "pyrsia.services.embedding_worker.main",
        "an embedding worker (buffers ids, pools embeddings, fans gradients out)",
    ),
    "nn-worker": (
        "pyrsia.services.nn_worker.launch",
        "the NN worker: runs train.py on N ranks through torch.distributed.run",
    ),
    "data-loader": (
        "persia._launch.data_loader",
        "a data loader: runs data_loader.py with REPLICA_INDEX/REPLICA_SIZE set",
    ),
    "run": (
        "persia._launch.run",
        "a whole job on this machine: Redis, PS, embedding worker, NN worker, data loader",
    ),
    "serve": (
        "persia._launch.serve",
        "answers predictions of an exported model over HTTP (msgpack or JSON)",
    ),
    "convert-checkpoint": (
        "pyrsia.services.embedding_ps.persia_convert",
        "a PERSIA embedding checkpoint (.emb files) -> a Pyrsia checkpoint",
    ),
    "status": (
        "persia._launch.status",
        "every process of a running job: health, uptime, memory, throughput, loss (--watch)",
    ),
    "prometheus-targets": (
        "persia._launch.prometheus",
        "the job's servers as Prometheus file_sd targets (--output F, --watch keeps it current)",
    ),
}


def _usage() -> str:
    lines = [
        "usage: persia-launcher <command> [flags]  (persia-launcher <command> --help for its flags)",
        "",
        "commands:",
    ]
    lines += [f"  {name:<28} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += [
        "",
        "environment: PERSIA_REDIS_URL (default redis://127.0.0.1:6379/0), PERSIA_JOB_ID (default",
        "'default'), PERSIA_EMBEDDING_CONFIG, PERSIA_GLOBAL_CONFIG, PERSIA_NN_WORKER_ENTRY,",
        "PERSIA_DATALOADER_ENTRY, LOG_LEVEL (DEBUG, INFO, WARNING, ERROR).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the subcommand's own entry point; return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        print(f"error: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[command][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
