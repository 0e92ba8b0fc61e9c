-- wake: push their wake-up messages to waiters a release handed the lease (or a permit) to
-- without expecting them (release.lua could not: a script touches only the keys it is given).
-- Each list gets its message and its expiry in one step: a caller that died between a push and
-- its expiry would leave the list for ever, its waiter gone.
--
-- KEYS[i]       a waiter's wake-up list
-- ARGV[2i - 1]  its message
-- ARGV[2i]      how long the list is kept, ms
--
-- Returns the number of lists pushed to.
for i, key in ipairs(KEYS) do
  redis.call('RPUSH', key, ARGV[2 * i - 1])
  redis.call('PEXPIRE', key, ARGV[2 * i])
end
return #KEYS
