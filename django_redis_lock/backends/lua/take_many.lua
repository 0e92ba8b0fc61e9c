-- take_many: take several free locks in one step, in the order given (lock_many's canonical
-- order), stopping at the first that someone else holds. Never queues: the caller waits in
-- line for that one next (join.lua), holding those before it, as ordered locking does; so
-- callers that list the same names in any order never deadlock. Only called when every key
-- is in one hash slot (one server, or names sharing a hash tag on a Redis Cluster).
--
-- KEYS[i]      the lease of the i-th lock
-- ARGV[1]      lease length, ms
-- ARGV[2i]     our token for the i-th lock
-- ARGV[2i+1]   our owner record for the i-th lock (see lease.py)
--
-- Returns {taken, pttl_ms, holder's lease value}: the number of locks we hold from the first
-- on (taken now, or ours already: a retry after a lost reply), then, when that is not all of
-- them, how long the next one's holder has left and its lease value ({taken, 0, false} when
-- all were taken).
local lease = duration(ARGV[1])
local now = nil
for i, key in ipairs(KEYS) do
  local token = ARGV[2 * i]
  local holder = redis.call('GET', key)
  if holder then
    if string.sub(holder, 1, #token + 1) ~= token .. '|' then
      return {i - 1, redis.call('PTTL', key), holder}
    end
  else
    now = now or server_time()
    redis.call('SET', key, token .. '|' .. now .. '|0|' .. ARGV[2 * i + 1], 'PX', lease)
  end
end
return {#KEYS, 0, false}
