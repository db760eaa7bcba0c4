-- multi.lua: decides several requests' batches in one call (store/redis/coalesce.go gathers
-- them), one after the other, each all or nothing as batch.lua decides it alone: the fixed cost
-- of a call (~5-8 µs in Redis) is shared. It follows batch.lua.
--
-- KEYS: the batches' KEYS (as batch.lua), one after the other.
-- ARGV: [1] m, the number of batches; then per batch: its number of KEYS, its number of ARGV,
--       then its ARGV (as batch.lua).
-- Reply: per batch, batch.lua's reply, or an error reply when that batch failed (a wrong-type
--        key, say): one caller's failure is not its neighbours'.

local function multi(KEYS, ARGV)
  bind_math()
  local clock = redis_time()
  local m = tonumber(ARGV[1])
  local out = {}
  local ko, ao = 0, 1
  for j = 1, m do
    local nk, na = tonumber(ARGV[ao + 1]), tonumber(ARGV[ao + 2])
    ao = ao + 2
    local ok, r = pcall(batch_at, KEYS, ARGV, ko, ao, clock)
    if ok then
      out[j] = r
    elseif type(r) == 'table' and r.err then
      out[j] = r
    else
      out[j] = { err = tostring(r) }
    end
    ko, ao = ko + nk, ao + na
  end
  return out
end
