-- take: acquire a free lock in one step, never queueing. Used for fenced acquisitions (the
-- fencing token comes from the server's clock), for guards that want a result, and by quorum
-- mode's waiters; a plain acquisition of a free lock is a bare `SET key value NX PX ms`
-- instead, with no script at all.
--
-- KEYS[1]  the lease
-- KEYS[2]  with the 'd' or 'j' flag: the guarded work's result
-- ARGV[1]  our token
-- ARGV[2]  lease length, ms
-- ARGV[3]  our owner record (see lease.py)
-- ARGV[4]  flags: 'f' give a fencing token; 'd' answer with the result (KEYS[2]) if there is one;
--          'j' answer with it if it is our job's id (a run of our job finished already);
--          'x' only take a lease over (below): a free lock is left free
-- ARGV[5...] optional: prefixes of lease values we take over as if the lock were free (our
--          job's reservation, core/lease.py)
--
-- Returns {1, fence, pttl_ms, ''} when we hold the lease (taken now, or ours already),
-- {0, pttl_ms, holder's lease value} when someone else holds it ({0, 0, false}: nobody, and the
-- 'x' flag), {2, result} with the 'd' or 'j' flag when the guarded work is done already.
local token, flags = ARGV[1], ARGV[4]
local lease = duration(ARGV[2])
if wants_result(flags) then
  local result = redis.call('GET', KEYS[2])
  if done(flags, result, token) then return {2, result} end
end
local holder = redis.call('GET', KEYS[1])
if holder and taken_over(holder, 5) then
  holder = false
elseif not holder and string.find(flags, 'x', 1, true) then
  return {0, 0, false}
end
if holder then
  if string.sub(holder, 1, #token + 1) == token .. '|' then
    local _, _, fence = lease_fields(holder)
    return {1, fence, redis.call('PTTL', KEYS[1]), ''}
  end
  return {0, redis.call('PTTL', KEYS[1]), holder}
end
local now, micros = server_time()
local fence = '0'
if string.find(flags, 'f', 1, true) then fence = string.format('%.0f', micros) end
redis.call('SET', KEYS[1], token .. '|' .. now .. '|' .. fence .. '|' .. ARGV[3], 'PX', lease)
return {1, fence, lease, ''}
