-- extend_many: the watchdog's renewal of many leases at once (one server, or Sentinel): one
-- script call, so one command and one reply for up to a thousand leases, instead of one each.
--
-- KEYS[i]       a lease
-- ARGV[2i - 1]  its holder's token
-- ARGV[2i]      its new length, ms
--
-- Returns the positions (1-based) of the leases that are no longer ours (they ended or changed
-- hands): those were not touched. Every length is checked before any lease is.
for i = 1, #KEYS do duration(ARGV[2 * i]) end
local lost = {}
for i, key in ipairs(KEYS) do
  local token = ARGV[2 * i - 1]
  local value = redis.pcall('GET', key)
  if type(value) == 'string' and string.sub(value, 1, #token + 1) == token .. '|' then
    redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    lost[#lost + 1] = i
  end
end
return lost
