"""One running job per job id: the job lease in Redis.

Every key of a job is namespaced by ``PERSIA_JOB_ID``, so a second job started with the
same id on the same Redis would overwrite the first one's registry records, and its data
loaders would send into the first one's NN workers. The lease makes that second job refuse
to start, while the processes of one job (started independently by honcho, compose or the
launcher, in any order) and the restart of a crashed process still get in.

The lease is one Redis hash, ``pyrsia:<job>:lease`` (TTL ``LEASE_TTL_S``, refreshed by every
member's heartbeat, so it lapses by itself when the whole job is gone)::

    instance        random id of this job instance (the first process to arrive makes it)
    started_ms      when the lease was made (Redis's clock)
    created_by      who made it: "role/index on host pid N"
    size:<role>     the role's replica count, as its first replica declared it
    slot:<role>:<i> the process holding replica i of role: {"id", "host", "pid", "since_ms",
                    "seen_ms"} (seen_ms: its last heartbeat, Redis's clock)

A process takes its slot ``(role, replica index)`` when it registers. The rule that tells
"another process of my job" from "a process of a second job with the same id":

- a slot nobody holds, or whose holder's heartbeat is older than the TTL, is taken: a new
  replica of the running job, or the restart of a crashed one;
- a slot held by a live process refuses: that slot's replica is running, so this process
  is a second copy of it, i.e. of a second job (one line, exit 2, naming the holder);
- a slot held by a process on this host (same host name and pid namespace) that no longer
  exists (its pid is gone or belongs to a process started at another time) is taken at once:
  ``kill -9`` then restart needs no wait; a holder on another host is waited for up to one
  TTL, since a dead holder stops refreshing;
- a replica count different from the one the role's live replicas declared refuses (two jobs
  of different shapes, or a job whose processes disagree); once no replica of the role is
  live, the new count is taken (a resized restart).

All decisions run inside Redis (Lua scripts, one round trip each), so two processes racing
for one slot cannot both win, and all times come from Redis's clock, not the hosts'.
On a clean exit a process gives its slot back; the last one out deletes the lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from pyrsia.shared.constants import (
    ENV_JOB_ID,
    LEASE_CLAIM_POLL_S,
    LEASE_TTL_S,
    lease_key,
)
from pyrsia.shared.errors import JobConflictError

log = logging.getLogger(__name__)

_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key, role, index, size, ttl = KEYS[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[6])
local me = cjson.decode(ARGV[5])
local takeover, refresh = ARGV[7], ARGV[8] == '1'
if redis.call('EXISTS', key) == 0 then
  redis.call('HSET', key, 'instance', ARGV[1], 'started_ms', now,
             'created_by', role .. '/' .. index .. ' on ' .. me.hostname .. ' pid ' .. me.pid)
end
local slot = 'slot:' .. role .. ':' .. index
local current = redis.call('HGET', key, slot)
local since = now
if current then
  local cur = cjson.decode(current)
  if cur.id == me.id then
    since = cur.since_ms
  elseif now - cur.seen_ms <= ttl and current ~= takeover then
    if refresh then return {'lost', current} end
    return {'held', current}
  end
end
local size_field = 'size:' .. role
local declared = tonumber(redis.call('HGET', key, size_field))
if declared and declared ~= size then
  local prefix = 'slot:' .. role .. ':'
  local fields = redis.call('HGETALL', key)
  for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, #prefix) == prefix and fields[i] ~= slot then
      local other = cjson.decode(fields[i + 1])
      if now - other.seen_ms <= ttl then return {'size', fields[i + 1], tostring(declared)} end
    end
  end
  for i = 1, #fields, 2 do  -- no live replica of the role: its old slots and count go
    if string.sub(fields[i], 1, #prefix) == prefix then redis.call('HDEL', key, fields[i]) end
  end
end
redis.call('HSET', key, size_field, size)
me.since_ms = since
me.seen_ms = now
redis.call('HSET', key, slot, cjson.encode(me))
redis.call('PEXPIRE', key, ttl)
return {'ok', redis.call('HGET', key, 'instance')}
"""

_RELEASE = """
local key, slot = KEYS[1], 'slot:' .. ARGV[1] .. ':' .. ARGV[2]
local current = redis.call('HGET', key, slot)
if not current or cjson.decode(current).id ~= ARGV[3] then return 0 end
redis.call('HDEL', key, slot)
local prefix = 'slot:' .. ARGV[1] .. ':'
local role_left, any_left = false, false
for _, field in ipairs(redis.call('HKEYS', key)) do
  if string.sub(field, 1, 5) == 'slot:' then any_left = true end
  if string.sub(field, 1, #prefix) == prefix then role_left = true end
end
if not any_left then redis.call('DEL', key)
elseif not role_left then redis.call('HDEL', key, 'size:' .. ARGV[1]) end
return 1
"""


def _proc_start_ticks(pid: int) -> int:
    """When process ``pid`` started (clock ticks after boot, /proc); 0 where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def _host_key() -> str:
    """This host's name plus its pid namespace: pids compare only within one namespace."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}/{namespace}"


@dataclass(frozen=True)
class Holder:
    """A process that can hold a slot: where it runs and which process it is."""

    hostname: str
    host: str  # hostname + pid namespace
    pid: int
    start_ticks: int

    @classmethod
    def this_process(cls) -> Holder:
        pid = os.getpid()
        return cls(socket.gethostname(), _host_key(), pid, _proc_start_ticks(pid))

    @property
    def id(self) -> str:
        return f"{self.host}|{self.pid}|{self.start_ticks}"

    def to_json(self) -> str:
        return json.dumps(
            {"id": self.id, "hostname": self.hostname, "host": self.host, "pid": self.pid}
        )


def _local_state(holder: dict[str, Any]) -> str:
    """ "gone" or "alive" for a holder on this host (pid namespace), else "unknown"."""
    if holder.get("host") != _host_key():
        return "unknown"
    pid = int(holder.get("pid", 0))
    if pid <= 0:
        return "unknown"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        pass  # alive, another user's
    recorded = str(holder.get("id", "")).rsplit("|", 1)[-1]
    if recorded not in ("", "0") and str(_proc_start_ticks(pid)) != recorded:
        return "gone"  # the pid now belongs to a process started later
    return "alive"


def _when(ms: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


class JobLease:
    """This process's slots in its job's lease (see the module docstring)."""

    def __init__(self, redis: Any, job_id: str, *, ttl_s: float = LEASE_TTL_S):
        self._redis = redis
        self.job_id = job_id
        self.ttl_ms = int(ttl_s * 1000)
        self.holder = Holder.this_process()
        self.instance: str | None = None
        self._slots: dict[tuple[str, int], int] = {}  # (role, index) -> size
        self._claim = redis.register_script(_CLAIM)
        self._release = redis.register_script(_RELEASE)

    @property
    def key(self) -> str:
        return lease_key(self.job_id)

    async def _run_claim(
        self, role: str, index: int, size: int, *, takeover: str = "", refresh: bool = False
    ) -> list[str]:
        args = [
            self.instance or uuid.uuid4().hex,
            role,
            index,
            size,
            self.holder.to_json(),
            self.ttl_ms,
            takeover,
            "1" if refresh else "0",
        ]
        return [str(x) for x in await self._claim(keys=[self.key], args=args)]

    async def claim(self, role: str, index: int, size: int) -> None:
        """Take slot ``(role, index)`` of a job whose ``role`` has ``size`` replicas.

        Raises :class:`JobConflictError` (one line naming the holder and how to pick another
        ``PERSIA_JOB_ID``) when a live process of a job with this id holds the slot, or when
        the role's live replicas declared another size. A holder on another host is waited
        for up to one TTL (a dead one stops refreshing); one on this host is known at once to
        be alive (refused) or gone (replaced).
        """
        deadline = time.monotonic() + self.ttl_ms / 1000 + LEASE_CLAIM_POLL_S
        takeover = ""
        while True:
            answer = await self._run_claim(role, index, size, takeover=takeover)
            if answer[0] == "ok":
                self.instance = answer[1]
                self._slots[(role, index)] = size
                return
            holder = json.loads(answer[1])
            state = _local_state(holder) if answer[0] == "held" else "alive"
            if state == "gone":
                log.info(
                    "%s/%d: its previous process (pid %s) is gone; taking its slot",
                    role,
                    index,
                    holder.get("pid"),
                )
                takeover = answer[1]
                continue
            if state == "unknown" and time.monotonic() < deadline:
                await asyncio.sleep(LEASE_CLAIM_POLL_S)
                continue
            raise await self._conflict(role, index, size, answer)

    async def _conflict(
        self, role: str, index: int, size: int, answer: list[str]
    ) -> JobConflictError:
        holder = json.loads(answer[1])
        try:
            lease = await self._redis.hgetall(self.key)
        except (RedisError, OSError):
            lease = {}
        started = lease.get("started_ms")
        running = (
            f"job '{self.job_id}' is already running (since {_when(float(started))}, "
            f"started by {lease.get('created_by', '?')})"
            if started
            else f"job '{self.job_id}' is already running"
        )
        who = (
            f"pid {holder.get('pid')} on {holder.get('hostname')} "
            f"(since {_when(float(holder.get('since_ms', 0)))})"
        )
        if answer[0] == "size":
            what = (
                f"its {answer[2]} {role} replica(s) are live ({role}/? held by {who}) but this "
                f"process is replica {index} of {size}"
            )
        else:
            what = f"{role}/{index} is held by {who}"
        return JobConflictError(
            f"{running}: {what}. Stop that job, or give this one another id "
            f"({ENV_JOB_ID}=<new id>, the same for every process of the job)"
        )

    async def refresh(self, role: str, index: int) -> bool:
        """Renew slot ``(role, index)`` (and the lease, made again if Redis lost it). False
        when another process has taken the slot meanwhile: logged, and not taken back."""
        size = self._slots.get((role, index))
        if size is None:
            return False
        answer = await self._run_claim(role, index, size, refresh=True)
        if answer[0] == "ok":
            self.instance = answer[1]
            return True
        holder = json.loads(answer[1])
        log.error(
            "%s/%d of job '%s' was taken by pid %s on %s while this process (pid %d) was "
            "not heard from; this process no longer registers it",
            role,
            index,
            self.job_id,
            holder.get("pid"),
            holder.get("hostname"),
            self.holder.pid,
        )
        return False

    async def release(self, role: str, index: int) -> None:
        """Give slot ``(role, index)`` back; the last slot out deletes the lease. Redis errors
        propagate (the caller bounds and logs them: the TTL ends the slot anyway)."""
        if self._slots.pop((role, index), None) is not None:
            await self._release(keys=[self.key], args=[role, index, self.holder.id])

    @property
    def slots(self) -> list[tuple[str, int]]:
        """The ``(role, index)`` slots this process holds."""
        return list(self._slots)
