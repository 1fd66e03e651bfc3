"""What ``persia-launcher run`` shows: every child's lines, prefixed, and one live progress line.

Each child's output comes out line by line behind its name (coloured on a terminal); when
standard output is a terminal, one line at the bottom is redrawn in place with the job's
training steps, samples/s and loss, read every second from the NN-worker ranks' ``/metrics``
(found in the registry).
"""

from __future__ import annotations

import asyncio
import math
import shutil
import threading
import time
from typing import IO

from pyrsia.shared.constants import PROGRESS_INTERVAL_S, PROGRESS_STOP_TIMEOUT_S, ROLE_NN_WORKER
from pyrsia.shared.settings import Settings

__all__ = ["NAMES", "Output", "Progress", "progress_text", "pump_lines"]


NAMES = ("redis", "embedding_parameter_server", "embedding_worker", "nn_worker", "data_loader")
_WIDTH = max(map(len, NAMES))
_COLORS = {
    "redis": 31,
    "embedding_parameter_server": 32,
    "embedding_worker": 33,
    "nn_worker": 36,
    "data_loader": 35,
    "run": 1,
}


class Output:
    """Prefixed lines from every child, and (on a terminal) one live progress line below them."""

    def __init__(self, stream: IO[str], *, live: bool, color: bool):
        self.stream, self.live, self.color = stream, live, color
        self._lock = threading.Lock()
        self._status = ""

    def _prefix(self, name: str) -> str:
        tag = f"{name:<{_WIDTH}} |"
        return f"\x1b[{_COLORS.get(name, 0)}m{tag}\x1b[0m" if self.color else tag

    def line(self, name: str, text: str) -> None:
        with self._lock:
            clear = "\r\x1b[K" if self.live and self._status else ""
            redraw = self._status if self.live else ""
            self.stream.write(f"{clear}{self._prefix(name)} {text}\n{redraw}")
            self.stream.flush()

    def status(self, text: str) -> None:
        if not self.live:
            return
        width = shutil.get_terminal_size().columns - 1  # a wrapped line would not redraw in place
        text = text[:width] if width > 0 else text
        with self._lock:
            self._status = text
            self.stream.write(f"\r\x1b[K{text}")
            self.stream.flush()

    def end_status(self) -> None:
        """Leave the last progress line on screen, followed by a newline."""
        with self._lock:
            if self.live and self._status:
                self.stream.write("\n")
                self.stream.flush()
            self._status = ""


def pump_lines(name: str, pipe: IO[bytes], out: Output) -> None:
    """Copy a child's lines out, prefixed. A line redrawn with carriage returns (a tqdm bar)
    comes out as a terminal would leave it: its last state."""
    for raw in iter(pipe.readline, b""):
        text = raw.decode("utf-8", "replace").rstrip("\r\n")
        if "\r" in text:
            text = next((part for part in reversed(text.split("\r")) if part.strip()), "")
        out.line(name, text)
    pipe.close()


def _parse_metrics(text: str) -> dict[str, float]:
    """The unlabelled ``pyrsia_nn_worker_*`` samples of one rank's ``/metrics`` text."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("pyrsia_nn_worker_") and "{" not in line:
            name, _, value = line.partition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                pass
    return values


def progress_text(ranks: list[dict[str, float]], elapsed_s: float) -> str:
    """The live line: steps (the slowest rank's), samples/s (all ranks), loss (their mean)."""
    clock = f"{int(elapsed_s) // 60}:{int(elapsed_s) % 60:02d}"
    steps = [r["pyrsia_nn_worker_steps"] for r in ranks if "pyrsia_nn_worker_steps" in r]
    if not steps:
        return f"[{clock}] waiting for the NN worker's first step"
    parts = [f"[{clock}] step {min(steps):.0f}"]
    rates = [r.get("pyrsia_nn_worker_samples_per_second") for r in ranks]
    if all(x is not None and math.isfinite(x) for x in rates):
        parts.append(f"{sum(rates):,.0f} samples/s")  # type: ignore[arg-type]
    losses = [r.get("pyrsia_nn_worker_loss") for r in ranks]
    losses = [x for x in losses if x is not None and math.isfinite(x)]
    if losses:
        parts.append(f"loss {sum(losses) / len(losses):.4f}")
    return "  ".join(parts)


class Progress(threading.Thread):
    """Reads the NN-worker ranks' /metrics every second: updates the live line, and says once
    how long after the start the first training step came."""

    def __init__(self, out: Output, started: float, settings: Settings):
        """``settings``: the job's, as its children get them (the Redis URL and job id)."""
        super().__init__(name="run-progress", daemon=True)
        self.out, self.started, self.settings = out, started, settings
        self._done = threading.Event()
        self.first_step_s: float | None = None

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=PROGRESS_STOP_TIMEOUT_S)

    def run(self) -> None:
        asyncio.run(self._loop())

    def _first_step(self, ranks: list[dict[str, float]], elapsed: float) -> None:
        if self.first_step_s is None and any(r.get("pyrsia_nn_worker_steps", 0) > 0 for r in ranks):
            self.first_step_s = elapsed
            self.out.line("run", f"first training step within {elapsed:.1f}s of the start")

    async def _loop(self) -> None:
        import aiohttp

        from pyrsia.shared.auth import AUTH_HEADER, auth_header_value, auth_token_from_env
        from pyrsia.shared.errors import RegistryError
        from pyrsia.shared.registry import Registry, RegistrySettings

        token = auth_token_from_env(self.settings)
        headers = {AUTH_HEADER: auth_header_value(token)} if token else {}
        registry = Registry(RegistrySettings.from_env(self.settings))
        timeout = aiohttp.ClientTimeout(total=PROGRESS_INTERVAL_S * 2)
        last: list[dict[str, float]] | None = None
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            while not self._done.is_set():
                ranks: list[dict[str, float]] = []
                try:
                    records = await registry.discover(ROLE_NN_WORKER)
                except RegistryError:
                    records = {}
                for record in records.values():
                    try:
                        async with session.get(f"{record.url}/metrics") as resp:
                            ranks.append(_parse_metrics(await resp.text()))
                    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                        pass
                elapsed = time.monotonic() - self.started
                if ranks:  # else (the ranks have left) the last figures stay
                    self._first_step(ranks, elapsed)
                    self.out.status(progress_text(ranks, elapsed))
                elif last is None:
                    self.out.status(progress_text([], elapsed))
                last = ranks or last
                await asyncio.sleep(PROGRESS_INTERVAL_S)
        await registry.close()
