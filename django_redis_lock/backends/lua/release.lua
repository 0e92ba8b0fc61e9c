-- release: end our hold. When waiters are queued, the lease goes straight to the first live
-- one (direct handoff): the release writes its lease and wakes it, so it enters with no round
-- trip of its own. The handed lease is short until the new holder lengthens it: HANDOFF_MS at
-- most, and never past the waiter's liveness deadline (handoff_ms()), so a waiter that died
-- just before its turn holds nobody up for longer than the queue counts it alive.
--
-- KEYS[1]  the lease
-- KEYS[2]  the queue
-- KEYS[3]  the waiters
-- KEYS[4]  the wake-up list of the waiter we expect first (ARGV[2]); any key of this lock
--          when we expect nobody
-- KEYS[5]  the guarded work's result
-- ARGV[1]  the holder's token
-- ARGV[2]  the token of the waiter we expect to be first ('' when unknown)
-- ARGV[3]  optional: '' (fair), or for a lock taken with fair=False the starvation bound, ms:
--          the first live waiter is handed the lease only once it has waited that long (since
--          it first queued, the '@' of its entry, join.lua); before that, the lease is deleted
--          and the waiter woken with an empty message, so that the releaser or a newcomer
--          may take the lock first, and the waiter asks again (unless it lost that race
--          lately: then it asks again on its own by the time its entry says, join.lua)
-- ARGV[4]  optional: the guarded work's result, kept for duplicates (a waiter that asked for it
--          with the 'd' flag is told the work is done; with 'j', only when it names its job)
-- ARGV[5]  with ARGV[4]: how long to keep it, ms
--
-- Returns 0 released, -1 not ours (the lease ended or changed hands: nothing touched),
-- -2 the key is not a lock at all (nothing touched) (plain numbers: the commonest reply is the
-- cheapest to make), {1, head} handed to the expected
-- waiter and woken (or, fair=False, the lock left free for a first waiter that lost the race
-- for it lately and asks again on its own soon, the '~' of its entry: not woken, expected or
-- not), {2, head, message} handed to another waiter (or, fair=False, the lock left
-- free for it: message ''), whom the caller wakes by pushing `message` on its wake-up list.
local token, expected = ARGV[1], ARGV[2]
local bound = tonumber(ARGV[3]) or 0
if ARGV[4] then duration(ARGV[5]) end
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'table' and value.err then return -2 end
if not value then return -1 end
if string.sub(value, 1, #token + 1) ~= token .. '|' then
  if not string.match(value, '^[^|]+|%d+|%d+|') then return -2 end
  return -1
end
if ARGV[4] then
  -- Written before the lock changes hands, so no duplicate can slip in between.
  redis.call('SET', KEYS[5], ARGV[4], 'PX', ARGV[5])
end
if bound > 0 then
  -- fair=False: the first live waiter is woken to compete for a free lock, unless it has
  -- starved for `bound` ms: then it is handed the lease below, as by a fair release.
  local now = server_time()
  local first = redis.call('LINDEX', KEYS[2], 0)
  while first do
    local entry = redis.call('HGET', KEYS[3], first)
    local deadline = entry and tonumber(string.match(entry, '^(%d+)|'))
    if deadline and deadline >= now then
      local since = tonumber(string.match(entry, '^%d+|[^|]*@(%d+)|')) or 0
      if now - since >= bound then break end
      redis.call('DEL', KEYS[1])
      -- It lost the race for a lock we left free lately, and asks again on its own by then.
      local retrying = tonumber(string.match(entry, '^%d+|[^|@]*~(%d+)'))
      if retrying and retrying > now then return {1, first} end
      if first ~= expected then return {2, first, ''} end
      redis.call('RPUSH', KEYS[4], '')
      redis.call('PEXPIRE', KEYS[4], 1000)
      return {1, first}
    end
    redis.call('LPOP', KEYS[2])  -- counted dead: out of the line, as below
    redis.call('HDEL', KEYS[3], first)
    first = redis.call('LINDEX', KEYS[2], 0)
  end
end
local head = redis.call('LPOP', KEYS[2])
if head then
  local now, micros = server_time()
  while head do
    local entry = redis.call('HGET', KEYS[3], head)
    redis.call('HDEL', KEYS[3], head)
    if entry then
      local first = string.find(entry, '|', 1, true)
      local second = string.find(entry, '|', first + 1, true)
      local flags, record = string.sub(entry, first + 1, second - 1), string.sub(entry, second + 1)
      local deadline = tonumber(string.sub(entry, 1, first - 1))
      if deadline >= now then
        local fence = '0'
        if string.find(flags, 'f', 1, true) then
          local _, _, previous = lease_fields(value)
          fence = string.format('%.0f', math.max(micros, tonumber(previous) + 1))
        end
        local wanted = tonumber(string.sub(record, 1, string.find(record, '|', 1, true) - 1))
        local ms = handoff_ms(wanted, deadline, now)
        redis.call('SET', KEYS[1], head .. '|' .. now .. '|' .. fence .. '|' .. record, 'PX', ms)
        local finished = '0'
        if wants_result(flags) and done(flags, redis.call('GET', KEYS[5]), head) then
          finished = '1'
        end
        local message = fence .. '|' .. ms .. '|' .. finished .. '|' .. string.format('%.0f', micros)
          .. '|' .. (redis.call('LINDEX', KEYS[2], 0) or '')
        if head ~= expected then return {2, head, message} end
        redis.call('RPUSH', KEYS[4], message)
        redis.call('PEXPIRE', KEYS[4], ms)
        return {1, head}
      end
    end
    head = redis.call('LPOP', KEYS[2])
  end
end
redis.call('DEL', KEYS[1])
return 0
