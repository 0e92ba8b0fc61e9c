-- permit_acquire: take one of a semaphore's permits, or queue for one (the semaphore's join.lua).
-- A permit is a member of a sorted set scored by when its lease ends, by the server's clock, so
-- a crashed holder's permit ends by itself and no client's clock is ever trusted.
--
-- KEYS[1]  the holders: token -> lease end, server ms (a sorted set)
-- KEYS[2]  their owner records: token -> 'since ms|limit|owner record' (a hash)
-- KEYS[3]  the queue: waiters' tokens, first come first served
-- KEYS[4]  the waiters: token -> 'liveness deadline ms|limit|owner record'
-- KEYS[5]  our wake-up list
-- ARGV[1]  our token
-- ARGV[2]  lease length, ms
-- ARGV[3]  our owner record (see lease.py)
-- ARGV[4]  mode: 0 take a permit or say who holds them (never queue); 1 take or queue; 2 take
--          or leave the queue (the wait is over); 3 leave the queue (interrupted)
-- ARGV[5]  flags: 'o' return a holder's value when not acquired (always in mode 0); 'b' the caller blocks on its
--          wake-up list right after this (same round trip): unless we queue it, push '' there
-- ARGV[6]  how long the queue may count us alive without hearing from us, ms
-- ARGV[7]  the number of permits (our limit: each caller is held to its own)
--
-- Returns {1, 0, lease_ms, '', other limit or 0} when we take a permit now, {1, 0, lease_ms,
-- message, 0} when a release handed it to us (its wake-up message, made again here: 'fence
-- 0|lease_ms|0|µs|the first tokens of the queue'); {0, pttl_ms, a holder's value or false,
-- ahead_ms, joined} when not (pttl: until the first permit's lease ends; ahead_ms and joined:
-- as join.lua's).
-- "other limit": a holder's, when it is not ours.
local token, mode, flags = ARGV[1], tonumber(ARGV[4]), ARGV[5]
local lease, liveness, limit = duration(ARGV[2]), duration(ARGV[6]), tonumber(ARGV[7])
if not limit or limit < 1 or limit % 1 ~= 0 then error('invalid limit: ' .. tostring(ARGV[7])) end
local now, micros = server_time()

local function leave()
  if redis.call('HDEL', KEYS[4], token) == 1 then redis.call('LREM', KEYS[3], 1, token) end
end
local function unblock()
  if string.find(flags, 'b', 1, true) then
    redis.call('RPUSH', KEYS[5], '')
    redis.call('PEXPIRE', KEYS[5], 1000)
  end
end

-- Our acquisition over (mode 3), we say so on our wake-up list, for a request of ours still on
-- its way (mark_left, LEFT: scripts.py). This is one, if that is there already.
if mode ~= 3 and left_already(KEYS[5]) then
  -- This request came after our leave, on another connection: nobody reads this reply, and
  -- nothing is queued or taken. (The block behind it, if any, pops the mark at once.)
  return {0, 0, false, 0, false}
end

local mine = redis.call('ZSCORE', KEYS[1], token)
if mine and tonumber(mine) > now then
  -- Handed to us by a release while we were not blocked. Its wake-up message may be on our
  -- list, on its way, or lost: we never depend on it, and say again what it says (join.lua).
  -- And we are alive: the short lease it handed us (permit_release.lua) becomes our whole
  -- one, unless we are leaving (mode 3), and give it back next.
  redis.call('DEL', KEYS[5])
  local ms = lease
  if mode == 3 then
    ms = tonumber(mine) - now
    mark_left(KEYS[5])
  else
    redis.call('ZADD', KEYS[1], now + lease, token)
    permits_expire(now)
  end
  unblock()
  local after = redis.call('LRANGE', KEYS[3], 0, NEXT_WAITERS - 1)
  local handed = string.format('%.0f', micros)
  return {1, 0, ms, '0|' .. ms .. '|0|' .. handed .. '|' .. table.concat(after, ' '), 0}
end
if mode == 3 then
  leave()
  mark_left(KEYS[5])
  return {0, 0, false}
end
permits_purge(now)
local free = limit - redis.call('ZCARD', KEYS[1])
if free > 0 and live_ahead(now, free, token) < free then
  leave()
  local other = permits_limit_of_first(limit)
  -- The hash first: a key of the wrong type fails it before anything is written (the sorted
  -- set's type was checked by the ZSCORE above), and both get their expiry right after.
  redis.call('HSET', KEYS[2], token, now .. '|' .. limit .. '|' .. ARGV[3])
  redis.call('ZADD', KEYS[1], now + lease, token)
  permits_expire(now)
  unblock()
  if other == limit then other = 0 end
  return {1, 0, lease, '', other}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local pttl = 0
if first[2] then pttl = math.max(1, tonumber(first[2]) - now) end
local ahead, joined = 0, false
if mode == 1 then
  joined = string.format('%.0f', micros)
  local joining = redis.call('HSET', KEYS[4], token, (now + liveness) .. '|' .. limit .. '|' .. ARGV[3]) == 1
  redis.call('PEXPIRE', KEYS[4], QUEUE_TTL_MS)
  if joining then redis.call('RPUSH', KEYS[3], token) end
  redis.call('PEXPIRE', KEYS[3], QUEUE_TTL_MS)
  ahead = ahead_ms(KEYS[3], KEYS[4], token, now)
else
  leave()
  unblock()
end
if (mode == 0 or string.find(flags, 'o', 1, true)) and first[1] then
  local entry = redis.call('HGET', KEYS[2], first[1])
  if entry then
    local since, _, record = string.match(entry, '^(%d+)|(%d+)|(.*)$')
    return {0, pttl, first[1] .. '|' .. since .. '|0|' .. record, ahead, joined}
  end
end
return {0, pttl, false, ahead, joined}
