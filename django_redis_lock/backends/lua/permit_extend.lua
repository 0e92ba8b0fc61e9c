-- permit_extend: make our permit's lease end ARGV[2] ms from now (renewal, extend()).
--
-- KEYS[1]  the holders (a sorted set, see permit_acquire.lua)
-- KEYS[2]  their owner records
-- ARGV[1]  our token
-- ARGV[2]  lease length, ms
--
-- Returns 1 when extended, 0 when the permit is not ours (its lease ended, or it was released
-- or force-released).
local lease = duration(ARGV[2])
local now = server_time()
local score = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(score) ~= 'string' then return 0 end
if tonumber(score) <= now then
  permits_purge(now)
  permits_expire(now)
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[1])
permits_expire(now)
return 1
