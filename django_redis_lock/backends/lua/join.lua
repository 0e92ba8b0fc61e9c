-- join: the contended acquisition. Takes the lock if it is free; else queues the waiter (or
-- refreshes its place), which then blocks on its own wake-up list (KEYS[4]) until a release
-- hands it the lease (release.lua).
--
-- KEYS[1]  the lease
-- KEYS[2]  the queue: waiters' tokens, first come first served
-- KEYS[3]  the waiters: token -> 'liveness deadline ms|flags|owner record'
-- KEYS[4]  our wake-up list
-- KEYS[5]  the guarded work's result (kept by a release for duplicates)
-- ARGV[1]  our token
-- ARGV[2]  lease length, ms
-- ARGV[3]  our owner record (see lease.py)
-- ARGV[4]  mode: 1 take it or queue; 2 take it or leave the queue (the wait is over);
--          3 leave the queue (interrupted); 4 take it or keep our place (fair=False, woken to
--          compete for a free lock: our entry still counts us alive; if it is gone, as 1),
--          marking our entry: we lost the race, and ask again on our own by
--          LOST_RACE_RETRY_MS from now ('~ms' before the '@' of 'u'), so that a release
--          until then leaves the lock free without waking us again (release.lua)
-- ARGV[5]  flags: 'f' give a fencing token; 'd' answer with the result (KEYS[5]) if there is
--          one; 'o' return the holder's lease value when not acquired; 'b' the caller blocks on
--          its wake-up list right after this (same round trip): unless we queue it, push '' there
--          so that the wait ends at once; 'j' as 'd', but only a result naming our token's job;
--          'u' (fair=False) keep when we first queued in our entry ('@ms': a release hands the
--          lease to a waiter that waited that long, release.lua)
-- ARGV[6]  how long the queue may count us alive without hearing from us, ms (mode 4: what
--          is left of it, should our entry be gone)
-- ARGV[7...] optional: prefixes of lease values we take over as if the lock were free (our
--          job's reservation, core/lease.py)
--
-- Returns {1, fence, lease_ms, ''} when we take the lease now; {1, fence, lease_ms, message}
-- when a release handed it to us (lengthened to our lease, unless we leave: mode 3, and
-- lease_ms is what it has left), with the wake-up message it sent made again here
-- ('fence|lease_ms|done|µs|next waiter's token or ''', done '1' when the 'd' or 'j' flag's
-- result is there); {0, pttl_ms, holder's lease value or false, ahead_ms, joined} when not
-- (ahead_ms: when queued, how long until the first live waiter ahead of us is counted dead, 0
-- if none: we block no longer; 0 for mode 4 keeping our place; pttl_ms: the holder's lease's
-- PTTL, or 0 when ahead_ms is not (not read: see below); joined: when queued or kept
-- there, the server's time in µs: a wake-up message handed before it is stale, see
-- release.lua); {2, result} with the 'd' or 'j' flag when the
-- guarded work is done already.
local token, mode, flags = ARGV[1], tonumber(ARGV[4]), ARGV[5]
local lease, liveness = duration(ARGV[2]), duration(ARGV[6])
local holder = redis.call('GET', KEYS[1])

local function leave()
  if redis.call('HDEL', KEYS[3], token) == 1 then redis.call('LREM', KEYS[2], 1, token) end
end
local function unblock()
  if string.find(flags, 'b', 1, true) then
    redis.call('RPUSH', KEYS[4], '')
    redis.call('PEXPIRE', KEYS[4], 1000)
  end
end

-- Our acquisition over (mode 3), we say so on our wake-up list, for a request of ours still on
-- its way (mark_left, LEFT: scripts.py). This is one, if that is there already.
if mode ~= 3 and left_already(KEYS[4]) then
  -- This request came after our leave, on another connection: nobody reads this reply, and
  -- nothing is queued or taken. (The block behind it, if any, pops the mark at once.)
  return {0, 0, false, 0, false}
end

if holder and string.sub(holder, 1, #token + 1) == token .. '|' then
  -- Handed to us by a release while we were not blocked. Its wake-up message may be on our
  -- list, still on its way (pushed a round trip after the release), or lost: we never depend
  -- on it, but say again what it says from what it was made of. Above all whether the guarded
  -- work is done: a waiter that wants the result must pass the lease on, never run the work.
  -- And we are alive: the short lease it handed us (release.lua) becomes our whole lease,
  -- unless we are leaving (mode 3), and pass it on next.
  redis.call('DEL', KEYS[4])
  local ms = lease
  if mode == 3 then
    ms = redis.call('PTTL', KEYS[1])
    mark_left(KEYS[4])
  else
    redis.call('PEXPIRE', KEYS[1], lease)
  end
  local _, _, fence = lease_fields(holder)
  local finished = '0'
  if wants_result(flags) and done(flags, redis.call('GET', KEYS[5]), token) then finished = '1' end
  unblock()
  local _, micros = server_time()
  local message = fence .. '|' .. ms .. '|' .. finished .. '|' .. string.format('%.0f', micros)
    .. '|' .. (redis.call('LINDEX', KEYS[2], 0) or '')
  return {1, fence, ms, message}
end
if mode == 3 then
  leave()
  mark_left(KEYS[4])
  return {0, 0, false}
end
if wants_result(flags) then
  local result = redis.call('GET', KEYS[5])
  if done(flags, result, token) then
    leave()
    unblock()
    return {2, result}
  end
end
if holder and taken_over(holder, 7) then holder = false end
if not holder then
  leave()
  local now, micros = server_time()
  local fence = '0'
  if string.find(flags, 'f', 1, true) then fence = string.format('%.0f', micros) end
  redis.call('SET', KEYS[1], token .. '|' .. now .. '|' .. fence .. '|' .. ARGV[3], 'PX', lease)
  unblock()
  return {1, fence, lease, ''}
end
local ahead, joined = 0, false
if mode == 1 or mode == 4 then
  local now, micros = server_time()
  joined = string.format('%.0f', micros)
  -- Our entry as it is, where it matters: mode 4 keeps it; 'u' keeps when we first queued.
  local earlier = (mode == 4 or string.find(flags, 'u', 1, true))
    and redis.call('HGET', KEYS[3], token)
  if mode == 4 and earlier then
    -- fair=False: we lost the race for the free lock we were woken to. We ask again on our
    -- own by LOST_RACE_RETRY_MS from now, so say so in our entry ('~ms' before its '@'; an
    -- entry without one, not of ours, is left as it is: we are woken as before): a release
    -- meanwhile leaves the lock free without waking us again (release.lua).
    local deadline, kept, record = string.match(earlier, '^(%d+)|([^|]*)|(.*)$')
    if deadline then
      kept = string.gsub(kept, '~%d+', '')
      kept = string.gsub(kept, '@', '~' .. (now + LOST_RACE_RETRY_MS) .. '@', 1)
      redis.call('HSET', KEYS[3], token, deadline .. '|' .. kept .. '|' .. record)
    end
  else
    local kept = flags
    if string.find(flags, 'u', 1, true) then
      kept = flags .. '@' .. ((earlier and string.match(earlier, '^%d+|[^|]*@(%d+)|')) or now)
    end
    local entry = (now + liveness) .. '|' .. kept .. '|' .. ARGV[3]
    -- Each key gets its expiry before the next command that could fail (a key of the wrong
    -- type), and one longer than any waiter's liveness: it outlives the live waiters, not the
    -- dead.
    local joining = redis.call('HSET', KEYS[3], token, entry) == 1
    redis.call('PEXPIRE', KEYS[3], QUEUE_TTL_MS)
    if joining then redis.call('RPUSH', KEYS[2], token) end
    redis.call('PEXPIRE', KEYS[2], QUEUE_TTL_MS)
    ahead = ahead_ms(KEYS[2], KEYS[3], token, now)
  end
else
  leave()
  unblock()
end
-- The holder's lease matters to us only when no live waiter is ahead: that one takes the
-- lock should the lease end without a release (and we look again by its liveness deadline).
local pttl = 0
if ahead == 0 then pttl = redis.call('PTTL', KEYS[1]) end
if string.find(flags, 'o', 1, true) then return {0, pttl, holder, ahead, joined} end
return {0, pttl, false, ahead, joined}
