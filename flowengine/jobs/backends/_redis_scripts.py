"""The Lua scripts that make each Redis board operation atomic.

Every job script takes the same keys,
``KEYS = [jobs, attempts, trash, trash_info, claim, fencing]`` (``claim`` is the job's own claim
key, ``fencing`` the board's last fencing token), and starts its arguments with
``ARGV = [uuid, channel, who, ...]``. Each returns ``{status, value}``: ``missing`` (no such
job), ``owned``/``notowner`` (value: the owner), ``trashed`` (value: the attempts), or a success
status (a claim's value: its fencing token). Every change is published on ``channel`` as JSON
(``event``: posted, claimed, renewed, released or removed) so that boards following it are woken
without polling.
"""

from __future__ import annotations

_PRELUDE = """
local uuid, channel, who = ARGV[1], ARGV[2], ARGV[3]
local function publish(event, extra)
  local message = extra or {}
  message['event'] = event
  message['uuid'] = uuid
  redis.call('PUBLISH', channel, cjson.encode(message))
end
local function to_trash(reason, attempts, now)
  redis.call('HSET', KEYS[3], uuid, redis.call('HGET', KEYS[1], uuid))
  redis.call('HSET', KEYS[4], uuid,
             cjson.encode({reason=reason, attempts=attempts, trashed_on=now}))
  redis.call('HDEL', KEYS[1], uuid)
  redis.call('HDEL', KEYS[2], uuid)
  redis.call('DEL', KEYS[5])
  publish('removed')
end
local function check_owner()
  if redis.call('HEXISTS', KEYS[1], uuid) == 0 then return {'missing', ''} end
  local owner = redis.call('GET', KEYS[5])
  if owner ~= who then return {'notowner', owner or ''} end
  return nil
end
local function attempts_of()
  return tonumber(redis.call('HGET', KEYS[2], uuid) or '0') or 0
end
"""

#: ARGV[4:] = ttl_ms, max_attempts, now.
CLAIM = _PRELUDE + """
if redis.call('HEXISTS', KEYS[1], uuid) == 0 then return {'missing', ''} end
local owner = redis.call('GET', KEYS[5])
if owner then return {'owned', owner} end
local attempts = attempts_of()
local limit = tonumber(ARGV[5])
if limit > 0 and attempts >= limit then
  to_trash('abandoned or orphaned ' .. attempts .. ' times', attempts, ARGV[6])
  return {'trashed', tostring(attempts)}
end
redis.call('SET', KEYS[5], who, 'PX', ARGV[4])
redis.call('HSET', KEYS[2], uuid, attempts + 1)
-- The claim's fencing token (records.fencing_token): above the board's last one and at least
-- the server's clock in microseconds; both fit a Lua number exactly, and '%.0f' writes them
-- whole (tostring would round them to 14 digits).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local token = string.format('%.0f', math.max((tonumber(redis.call('GET', KEYS[6]) or '0')
                                              or 0) + 1, now))
redis.call('SET', KEYS[6], token)
publish('claimed', {ttl_ms=tonumber(ARGV[4])})
return {'claimed', token}
"""

#: ARGV[4:] = ttl_ms.
KEEP_ALIVE = _PRELUDE + """
if redis.call('GET', KEYS[5]) ~= who then return {'lost', ''} end
redis.call('PEXPIRE', KEYS[5], ARGV[4])
publish('renewed', {ttl_ms=tonumber(ARGV[4])})
return {'renewed', ''}
"""

CONSUME = _PRELUDE + """
local refused = check_owner()
if refused then return refused end
redis.call('HDEL', KEYS[1], uuid)
redis.call('HDEL', KEYS[2], uuid)
redis.call('DEL', KEYS[5])
publish('removed')
return {'consumed', ''}
"""

#: ARGV[4:] = counted (1 or 0), max_attempts, now.
ABANDON = _PRELUDE + """
local refused = check_owner()
if refused then return refused end
redis.call('DEL', KEYS[5])
local attempts = attempts_of()
local limit = tonumber(ARGV[5])
if ARGV[4] == '0' then
  redis.call('HSET', KEYS[2], uuid, math.max(attempts - 1, 0))
elseif limit > 0 and attempts >= limit then
  to_trash('abandoned or orphaned ' .. attempts .. ' times', attempts, ARGV[6])
  return {'trashed', tostring(attempts)}
end
publish('released')
return {'released', ''}
"""

#: ARGV[4:] = reason, now, counted ('0': the claim held to trash it is not an attempt).
TRASH = _PRELUDE + """
local refused = check_owner()
if refused then return refused end
local attempts = attempts_of()
if ARGV[6] == '0' and attempts > 0 then attempts = attempts - 1 end
to_trash(ARGV[4], attempts, ARGV[5])
return {'trashed', ''}
"""

REPOST = _PRELUDE + """
local posting = redis.call('HGET', KEYS[3], uuid)
if not posting then return {'missing', ''} end
redis.call('HSET', KEYS[1], uuid, posting)
redis.call('HDEL', KEYS[3], uuid)
redis.call('HDEL', KEYS[4], uuid)
redis.call('HDEL', KEYS[2], uuid)
redis.call('DEL', KEYS[5])
publish('posted', {posting=posting})
return {'posted', posting}
"""

#: ARGV[4:] = the damaged value as it was read, its trash record (JSON), its trash info (JSON).
#: Nothing moves if the value changed since, or somebody holds a claim on its key.
TRASH_DAMAGED = _PRELUDE + """
if redis.call('HGET', KEYS[1], uuid) ~= ARGV[4] then return {'changed', ''} end
local owner = redis.call('GET', KEYS[5])
if owner then return {'owned', owner} end
redis.call('HSET', KEYS[3], uuid, ARGV[5])
redis.call('HSET', KEYS[4], uuid, ARGV[6])
redis.call('HDEL', KEYS[1], uuid)
redis.call('HDEL', KEYS[2], uuid)
publish('removed')
return {'trashed', ''}
"""

DISCARD = _PRELUDE + """
if redis.call('HDEL', KEYS[3], uuid) == 0 then return {'missing', ''} end
redis.call('HDEL', KEYS[4], uuid)
return {'discarded', ''}
"""

#: ARGV[4:] = posting (JSON).
POST = _PRELUDE + """
redis.call('HSET', KEYS[1], uuid, ARGV[4])
publish('posted', {posting=ARGV[4]})
return {'posted', ''}
"""

# Entities: KEYS = [entities (hash: "kind:name" -> JSON), expiries (sorted set: "kind:name" ->
# when it lapses, in ms of the server's clock)], so listing never scans the keyspace.
_NOW_MS = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

#: ARGV = member, entity JSON, ttl_ms.
REGISTER = _NOW_MS + """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
return 1
"""

#: Drops the lapsed entities and returns the others as HGETALL does.
LIVE_ENTITIES = _NOW_MS + """
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  redis.call('HDEL', KEYS[1], member)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return redis.call('HGETALL', KEYS[1])
"""
