-- extend: make our lease end ARGV[2] ms from now (renewal, extend()).
--
-- KEYS[1]  the lease
-- ARGV[1]  our token
-- ARGV[2]  lease length, ms
--
-- Returns 1 when extended, 0 when the lease is not ours (it ended or changed hands).
local lease = duration(ARGV[2])
local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' or string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then
  return 0
end
redis.call('PEXPIRE', KEYS[1], lease)
return 1
