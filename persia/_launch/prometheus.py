"""``persia-launcher prometheus-targets``: the job's servers as Prometheus ``file_sd`` targets.

::

    persia-launcher prometheus-targets                          the targets on stdout, once
    persia-launcher prometheus-targets --output targets/pyrsia.json           written once
    persia-launcher prometheus-targets --output targets/pyrsia.json --watch   kept current

It reads the registry of ``PERSIA_JOB_ID`` on ``PERSIA_REDIS_URL``, as ``persia-launcher
status`` does (the same roles: embedding PS replicas, embedding workers, and the NN-worker
ranks' ingress), and writes one target group per registered server, in the format of
Prometheus's ``file_sd_configs``::

    [{"targets": ["10.0.0.5:8888"],
      "labels": {"job": "<PERSIA_JOB_ID>", "role": "embedding_parameter_server",
                 "replica_index": "0"}}, ...]

The ``job`` label is the Pyrsia job id (a target's own ``job`` label wins over the scrape
config's ``job_name`` in Prometheus), so one Prometheus can watch several jobs and the
Grafana dashboard (``monitoring/``) picks one by it. With ``--watch`` the registry is read
again every ``--interval`` seconds and the file is replaced atomically (written beside it,
then renamed: Prometheus never reads half a file) whenever the set of targets changed; a
Redis outage keeps the last file. SIGTERM or Ctrl-C ends it with exit code 0.

Exit code: 0 on success, 2 when the registry cannot be read (once) or the file cannot be
written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

from persia._launch.status import SERVER_ROLES
from pyrsia.shared.constants import PROMETHEUS_REDIS_WAIT_S
from pyrsia.shared.constants import PROMETHEUS_TARGETS_INTERVAL_S as DEFAULT_INTERVAL_S
from pyrsia.shared.errors import PersiaError
from pyrsia.shared.logging_setup import configure_logging
from pyrsia.shared.registry import Registry, RegistrySettings
from pyrsia.shared.settings import current

log = logging.getLogger(__name__)


async def target_groups(registry: Registry) -> list[dict]:
    """One ``file_sd`` target group per registered server of the registry's job, sorted by
    role (in :data:`SERVER_ROLES` order) and replica index (raises RegistryError)."""
    job = registry.settings.job_id
    groups = []
    for role in SERVER_ROLES:
        for index, rec in sorted((await registry.discover(role)).items()):
            groups.append(
                {
                    "targets": [rec.address],
                    "labels": {"job": job, "role": rec.role, "replica_index": str(index)},
                }
            )
    return groups


def render(groups: list[dict]) -> str:
    return json.dumps(groups, indent=2) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: a temporary file in the same folder, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # readable by a Prometheus running as another user
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def _once(settings: RegistrySettings) -> str:
    registry = Registry(settings)
    try:
        await registry.ping()
        return render(await target_groups(registry))
    finally:
        await registry.close()


async def _watch(settings: RegistrySettings, output: Path, interval_s: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    registry = Registry(settings)
    written: str | None = None
    try:
        # under compose, Redis may start alongside
        await registry.ping(wait_s=PROMETHEUS_REDIS_WAIT_S)
        while not stop.is_set():
            try:
                text = render(await target_groups(registry))
            except PersiaError as exc:  # Redis down before any answer: keep the last file
                log.warning("cannot read the registry (%s); keeping %s", exc, output)
            else:
                if text != written:
                    write_atomically(output, text)
                    log.info("%s: %d targets", output, len(json.loads(text)))
                    written = text
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except TimeoutError:
                pass
    finally:
        await registry.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="persia-launcher prometheus-targets",
        description="Write the job's servers (PS replicas, embedding workers, NN-worker "
        "ranks) as Prometheus file_sd targets, labelled job, role, replica_index "
        "(PERSIA_REDIS_URL, PERSIA_JOB_ID).",
    )
    parser.add_argument(
        "--output", default="-", help="the file_sd JSON file to write ('-': stdout, once)"
    )
    parser.add_argument(
        "--watch",
        action="store_true",
        help="keep the file current: reread the registry every --interval "
        "seconds and replace the file atomically when the targets change",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help="seconds between registry reads with --watch",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.interval > 0:
        print("error: --interval: expected a number of seconds > 0", file=sys.stderr)
        return 2
    if args.watch and args.output == "-":
        print("error: --watch needs --output FILE (Prometheus reads a file)", file=sys.stderr)
        return 2
    environment = current()  # an entry point
    configure_logging("prometheus-targets", None, environment.log_level)
    try:
        settings = RegistrySettings.from_env(environment)
        if args.watch:
            return asyncio.run(_watch(settings, Path(args.output), args.interval))
        text = asyncio.run(_once(settings))
        if args.output == "-":
            sys.stdout.write(text)
        else:
            write_atomically(Path(args.output), text)
    except PersiaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write {args.output}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
