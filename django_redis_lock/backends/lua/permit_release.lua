-- permit_release: give a semaphore's permit back. While waiters are queued, each permit that is
-- free now goes straight to the first live waiter (direct handoff, as release.lua does for a
-- lock), first come first served: several at once when several are free (a holder's lease
-- ended meanwhile). A handed permit's lease is short until its new holder lengthens it:
-- HANDOFF_MS at most, never past the waiter's liveness deadline (handoff_ms()).
--
-- KEYS[1]  the holders (a sorted set, see permit_acquire.lua)
-- KEYS[2]  their owner records
-- KEYS[3]  the queue
-- KEYS[4]  the waiters
-- KEYS[5...] the wake-up lists of the waiters we expect first (ARGV[2]), in order; one key of
--          the semaphore when we expect nobody
-- ARGV[1]  the holder's token
-- ARGV[2]  the tokens of the waiters we expect first, separated by spaces ('' when unknown):
--          the first of the queue when our permit was granted (a grant's message lists them).
--          With N permits, up to N - 1 releases may have come between, so the head now is one
--          of the first N then: we wake it here, in this round trip.
--
-- Returns {-1} not ours (its lease ended, or it was released already: nothing touched), {-2}
-- the key is not a semaphore's, {0} released, {1} released and handed to expected waiters
-- only, or {2, token, message, token, message...}: released, and permits handed to those
-- waiters (besides expected ones), whom the caller wakes by pushing the message on their
-- wake-up lists. A message is 'fence|lease ms|done|handed at µs|the first tokens of the queue
-- after it' (release.lua's).
local token, expected = ARGV[1], {}
local position = 5
for waiter in string.gmatch(ARGV[2], '%S+') do
  expected[waiter] = KEYS[position]
  position = position + 1
end
local now, micros = server_time()
local score = redis.pcall('ZSCORE', KEYS[1], token)
if type(score) == 'table' and score.err then return {-2} end
if not score then return {-1} end
redis.call('ZREM', KEYS[1], token)
redis.call('HDEL', KEYS[2], token)
if tonumber(score) <= now then
  permits_expire(now)
  return {-1}  -- its lease had ended (the purge had not come by yet): a loss, not a release
end
permits_purge(now)
local held = redis.call('ZCARD', KEYS[1])
local woken, handed = {2}, false
local head = redis.call('LINDEX', KEYS[3], 0)
while head do
  local entry = redis.call('HGET', KEYS[4], head)
  local deadline, limit, record
  if entry then deadline, limit, record = string.match(entry, '^(%d+)|(%d+)|(.*)$') end
  if entry and tonumber(deadline) >= now then
    if held >= tonumber(limit) then break end  -- first come first served: nobody jumps it
    redis.call('LPOP', KEYS[3])
    redis.call('HDEL', KEYS[4], head)
    local wanted = tonumber(string.sub(record, 1, string.find(record, '|', 1, true) - 1))
    local ms = handoff_ms(wanted, tonumber(deadline), now)
    redis.call('HSET', KEYS[2], head, now .. '|' .. limit .. '|' .. record)
    redis.call('ZADD', KEYS[1], now + ms, head)
    held, handed = held + 1, true
    local after = redis.call('LRANGE', KEYS[3], 0, NEXT_WAITERS - 1)
    local message = '0|' .. ms .. '|0|' .. string.format('%.0f', micros) .. '|'
      .. table.concat(after, ' ')
    local wake = expected[head]
    if wake then
      redis.call('RPUSH', wake, message)
      redis.call('PEXPIRE', wake, ms)
    else
      woken[#woken + 1] = head
      woken[#woken + 1] = message
    end
  else
    redis.call('LPOP', KEYS[3])
    redis.call('HDEL', KEYS[4], head)
  end
  head = redis.call('LINDEX', KEYS[3], 0)
end
permits_expire(now)
if not handed then return {0} end
if #woken == 1 then return {1} end
return woken
