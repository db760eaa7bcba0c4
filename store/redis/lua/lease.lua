-- lease.lua: settles a reservation's lease record once (store.Leaser's SettleLease). The
-- record is "U|" .. rec while unsettled, "S" .. used .. "|" .. rec once settled, and keeps
-- its expiry: a repeated settlement finds the first one's used until the lease would have
-- expired.
--
-- KEYS: [1] the lease record. ARGV: [1] used, a decimal integer.
-- Reply: {0} no such lease; {1, rec} settled now; {2, used, rec} settled before with used.

local function settle_lease(KEYS, ARGV)
  local v = redis.call('GET', KEYS[1])
  if not v then return { 0 } end
  if string.sub(v, 1, 2) == 'U|' then
    local rec = string.sub(v, 3)
    redis.call('SET', KEYS[1], 'S' .. ARGV[1] .. '|' .. rec, 'KEEPTTL')
    return { 1, rec }
  end
  local bar = string.find(v, '|', 2, true)
  if string.sub(v, 1, 1) ~= 'S' or not bar then error('sluice: bad lease record') end
  return { 2, string.sub(v, 2, bar - 1), string.sub(v, bar + 1) }
end

-- renew_lease sets an unsettled lease's expiry to ARGV[1] ms from now. KEYS: [1] the record.
-- Reply: {0} no such lease; {1, rec} renewed; {2} settled already (unchanged).
local function renew_lease(KEYS, ARGV)
  local v = redis.call('GET', KEYS[1])
  if not v then return { 0 } end
  if string.sub(v, 1, 2) ~= 'U|' then return { 2 } end
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return { 1, string.sub(v, 3) }
end
