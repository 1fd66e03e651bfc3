"""Which TCP sockets a set of processes listens on, read from /proc (Linux; no psutil).

``/proc/net/tcp`` and ``/proc/net/tcp6`` list every socket with its local address, state and
inode; ``/proc/<pid>/fd`` links name the inodes a process holds (``socket:[inode]``). A
socket in state 0A (LISTEN) whose inode one of the processes holds is one it listens on.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

_LISTEN = "0A"


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (children of children too)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))


def listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """``(pid, address, port)`` of every TCP socket in LISTEN state held by ``pids``."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            local, state, inode = parts[1], parts[3], parts[9]
            if state != _LISTEN or inode not in owner:
                continue
            host, port = local.split(":")
            found.append((owner[inode], _address(host), int(port, 16)))
    return sorted(set(found))


def is_loopback(address: str) -> bool:
    addr = ipaddress.ip_address(address)
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback
