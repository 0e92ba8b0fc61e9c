-- charge_replay: count the bytes of a response kept for replay against its budgets.
--
-- KEYS[1]  the budget of one window (a hash: 'total', and the bytes kept per client)
-- ARGV[1]  the client (a hash of its identity)
-- ARGV[2]  bytes to keep
-- ARGV[3]  the most bytes one client may keep per window
-- ARGV[4]  the most bytes kept in all per window
-- ARGV[5]  the window, ms
--
-- Returns 1 when charged, 0 when the client's budget is spent, -1 when the total is.
local window, bytes = duration(ARGV[5]), tonumber(ARGV[2])
if tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') + bytes > tonumber(ARGV[3]) then
  return 0
end
if tonumber(redis.call('HGET', KEYS[1], 'total') or '0') + bytes > tonumber(ARGV[4]) then
  return -1
end
redis.call('HINCRBY', KEYS[1], ARGV[1], bytes)
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], window) end
redis.call('HINCRBY', KEYS[1], 'total', bytes)
return 1
