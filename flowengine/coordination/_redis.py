"""Lock and limit queues on Redis: sorted sets, expiring entries, a change channel.

Layout under the ``namespace`` (the jobboard's conf key; ``flowengine`` by default):

==============================  ===========================================================
``<ns>:coord:q:<key>``          sorted set: entry -> its number (the queue, FIFO)
``<ns>:coord:x:<key>``          sorted set: entry -> when its lease ends (server clock, ms)
``<ns>:coord:i:<key>``          hash: entry -> who holds or waits, and for what (JSON)
``<ns>:coord:keys``             set: the keys that have a queue (for listing)
``<ns>:coord:seq``              the counter entries are numbered by
``<ns>:coord:events``           channel: the key whose queue changed
==============================  ===========================================================

Every operation is one Lua script, atomic on the server and timed by the server's clock, which
removes the entries whose lease ended before it answers. Redis announces nothing when time
ends a lease, so a waiter is told when the soonest lease ahead of it may end (``wake_in``) and
looks again then; everything else is pushed on the channel.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid as uuidlib
from collections.abc import Callable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.coordination.service import Entry, LeaseLost, Place, Service
from flowengine.utils import redis_utils

import redis  # isort: skip  (redis_utils above names the extra when it is missing)

__all__ = ["RedisService"]

LOG = logging.getLogger(__name__)

_RECONNECT_DELAYS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)

# KEYS = [queue, expiries, infos, keyset]; every script prunes the ended entries first.
_PRUNE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local function prune(key, channel)
  local ended = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, e in ipairs(ended) do
    redis.call('ZREM', KEYS[1], e)
    redis.call('ZREM', KEYS[2], e)
    redis.call('HDEL', KEYS[3], e)
  end
  if redis.call('ZCARD', KEYS[1]) == 0 then redis.call('SREM', KEYS[4], key) end
  if #ended > 0 then redis.call('PUBLISH', channel, key) end
end
"""

#: KEYS += [counter]; ARGV = entry, ttl ms, info, key, channel. Returns the entry's number.
JOIN = _PRUNE + """
prune(ARGV[4], ARGV[5])
local number = redis.call('INCR', KEYS[5])
redis.call('ZADD', KEYS[1], number, ARGV[1])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('SADD', KEYS[4], ARGV[4])
redis.call('PUBLISH', ARGV[5], ARGV[4])
return number
"""

#: ARGV = entry, limit, key, channel. Returns {position (-1: gone), ms until an entry ahead
#: may end (-1: none), info of each holder ahead...}.
LOOK = _PRUNE + """
prune(ARGV[3], ARGV[4])
local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
if not rank then return {-1, -1} end
local limit = tonumber(ARGV[2])
local answer = {rank, -1}
local shown = math.min(rank, limit)
if shown > 0 then
  for _, e in ipairs(redis.call('ZRANGE', KEYS[1], 0, shown - 1)) do
    table.insert(answer, redis.call('HGET', KEYS[3], e) or '{}')
  end
end
if rank >= limit then
  for _, e in ipairs(redis.call('ZRANGE', KEYS[1], 0, rank - 1)) do
    local left = tonumber(redis.call('ZSCORE', KEYS[2], e)) - now
    if answer[2] < 0 or left < answer[2] then answer[2] = left end
  end
end
return answer
"""

#: ARGV = entry, ttl ms, key, channel. Returns 1 if renewed, 0 if the entry is gone.
RENEW = _PRUNE + """
prune(ARGV[3], ARGV[4])
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""

#: ARGV = entry, key, channel.
LEAVE = _PRUNE + """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
prune(ARGV[2], ARGV[3])
redis.call('PUBLISH', ARGV[3], ARGV[2])
return 1
"""

#: ARGV = key, channel. Returns {now ms, entry, number, ends ms, info, ...} of the live entries.
LIST = _PRUNE + """
prune(ARGV[1], ARGV[2])
local answer = {now}
for _, e in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  table.insert(answer, e)
  table.insert(answer, redis.call('ZSCORE', KEYS[1], e))
  table.insert(answer, redis.call('ZSCORE', KEYS[2], e))
  table.insert(answer, redis.call('HGET', KEYS[3], e) or '{}')
end
return answer
"""


class RedisService(Service):
    """Queues of leased entries on Redis (see the module).

    Args:
        conf: A jobboard conf (``host``, ``port``, ``password``, ``db``, ``namespace``,
            sentinel and ssl keys).
        ttl: Seconds an entry lives without renewal.
    """

    def __init__(self, conf: Mapping[str, Any], ttl: float) -> None:
        host = conf.get("host") or "localhost"
        super().__init__(f"redis at {host}:{conf.get('port') or 6379}", ttl)
        self._conf = dict(conf)
        ns = str(conf.get("namespace") or "flowengine")
        self._prefix = f"{ns}:coord"
        self._channel = f"{self._prefix}:events"
        self._client: redis.Redis | None = None
        self._scripts: dict[str, Any] = {}
        self._stopping = threading.Event()
        self._stop_channel = ""
        self._thread: threading.Thread | None = None

    def _keys(self, key: str) -> list[str]:
        return [f"{self._prefix}:q:{key}", f"{self._prefix}:x:{key}", f"{self._prefix}:i:{key}",
                f"{self._prefix}:keys"]

    def connect(self, on_change: Callable[[str | None], None]) -> None:
        """Connect, check Redis answers, and follow the change channel on a thread."""
        client = self._client = redis_utils.make_client(self._conf)
        try:
            client.ping()
        except redis.RedisError as err:
            raise exc.JobFailure(f"Cannot reach {self.where} for locks and limits: {err}") \
                from err
        self._scripts = {name: client.register_script(text) for name, text in (
            ("JOIN", JOIN), ("LOOK", LOOK), ("RENEW", RENEW), ("LEAVE", LEAVE), ("LIST", LIST))}
        self._stopping.clear()
        self._stop_channel = f"{self._prefix}:stop:{uuidlib.uuid4().hex}"
        following = threading.Event()
        self._thread = threading.Thread(target=self._follow, args=(on_change, following),
                                        daemon=True, name="coordination-redis")
        self._thread.start()
        following.wait(5.0)

    def _follow(self, on_change: Callable[[str | None], None], following: threading.Event) -> None:
        failures = 0
        while not self._stopping.is_set():
            assert self._client is not None
            pubsub = self._client.pubsub()
            try:
                pubsub.subscribe(self._channel, self._stop_channel)
                while not self._stopping.is_set():
                    message = pubsub.get_message(timeout=None)
                    if message is None:
                        continue
                    failures = 0
                    channel = _text(message.get("channel"))
                    if message.get("type") == "subscribe" and channel == self._channel:
                        following.set()
                        on_change(None)  # anything published while away was missed
                    elif message.get("type") == "message" and channel == self._channel:
                        on_change(_text(message.get("data")))
            except (redis.RedisError, OSError) as err:
                delay = _RECONNECT_DELAYS[min(failures, len(_RECONNECT_DELAYS) - 1)]
                failures += 1
                LOG.warning("Lost the change channel on %s (%s); again in %.2fs", self.where,
                            err, delay)
                self._stopping.wait(delay)
            except Exception:  # one bad message or callback must not stop the following
                LOG.exception("Following changes on %s failed", self.where)
            finally:
                try:
                    pubsub.close()
                except redis.RedisError:  # closing a dead connection
                    pass

    def _run(self, script: str, key: str, *args: Any, extra_keys: tuple[str, ...] = ()) -> Any:
        if self._client is None:
            raise exc.JobFailure(f"Locks and limits on {self.where} are not connected")
        try:
            return self._scripts[script](keys=[*self._keys(key), *extra_keys], args=list(args))
        except redis.RedisError as err:
            raise exc.JobFailure(f"Could not {script.lower()} the queue of {key!r} on "
                                 f"{self.where}: {err}") from err

    def join(self, key: str, limit: int, info: Mapping[str, Any]) -> str:
        """Add an entry at the tail of ``key``'s queue; its id."""
        entry = uuidlib.uuid4().hex
        self._run("JOIN", key, entry, int(self.ttl * 1000), json.dumps({**info, "limit": limit}),
                  key, self._channel, extra_keys=(f"{self._prefix}:seq",))
        return entry

    def look(self, key: str, entry: str, limit: int) -> Place:
        """Where ``entry`` stands (raises LeaseLost if it is gone)."""
        answer = self._run("LOOK", key, entry, limit, key, self._channel)
        position, wake_ms = int(answer[0]), int(answer[1])
        if position < 0:
            raise LeaseLost(f"The entry of {key!r} on {self.where} ended: its lease expired")
        holders = tuple(json.loads(_text(raw)) for raw in answer[2:])
        return Place(position, position < limit, holders,
                     None if wake_ms < 0 else max(wake_ms, 0) / 1000.0)

    def renew(self, key: str, entry: str) -> None:
        """Renew ``entry``'s lease (raises LeaseLost if it is gone)."""
        if not int(self._run("RENEW", key, entry, int(self.ttl * 1000), key, self._channel)):
            raise LeaseLost(f"The entry of {key!r} on {self.where} ended: its lease expired")

    def leave(self, key: str, entry: str) -> None:
        """Remove ``entry``."""
        self._run("LEAVE", key, entry, key, self._channel)

    def listing(self) -> list[Entry]:
        """Every live entry, by key and position."""
        if self._client is None:
            raise exc.JobFailure(f"Locks and limits on {self.where} are not connected")
        try:
            keys = sorted(_text(k) for k in self._client.smembers(f"{self._prefix}:keys"))
        except redis.RedisError as err:
            raise exc.JobFailure(f"Could not list the locks on {self.where}: {err}") from err
        found: list[Entry] = []
        for key in keys:
            answer = self._run("LIST", key, key, self._channel)
            now = float(answer[0])
            rows = answer[1:]
            for position, index in enumerate(range(0, len(rows), 4)):
                entry, _number, ends, raw = rows[index:index + 4]
                info = json.loads(_text(raw))
                found.append(Entry(key, _text(entry), position, int(info.get("limit") or 1),
                                   info, max(0.0, (float(ends) - now) / 1000.0)))
        return found

    def close(self) -> None:
        """Stop following the channel and disconnect."""
        self._stopping.set()
        if self._client is not None:
            try:
                self._client.publish(self._stop_channel, "stop")
            except redis.RedisError:
                LOG.debug("%s unreachable while closing", self.where)
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        if self._client is not None:
            self._client.close()
            self._client = None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
