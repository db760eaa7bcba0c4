-- multi.lua: decides several requests' batches in one call (store/redis/coalesce.go gathers
-- them), one after the other, each all or nothing as batch.lua decides it alone: the fixed cost
-- of a call (~5-8 µs in Redis) is shared. It follows batch.lua.
--
-- KEYS: the batches' KEYS (as batch.lua), one after the other.
-- ARGV: the batches' ARGV (as batch.lua: a head, then one string per op), one after the other.
-- Reply: one flat array, per batch either batch.lua's reply or an error reply when that batch
--        failed (a wrong-type key, say): one caller's failure is not its neighbours'. A flat
--        array rather than an array per batch: each nested table cost Redis about 1 µs to make
--        and send.

local function multi(KEYS, ARGV)
  bind_globals()
  begin_call()
  local clock = redis_time()
  local out, o = reply, 0
  local ko, ao, na = 0, 0, #ARGV
  while ao < na do
    local n, nk, now, ttl, fp = parse_head(ARGV[ao + 1])
    if not now then now = clock() end
    local ok, r = pcall(batch_at, KEYS, ARGV, ko, ao + 1, n, nk, now, ttl, fp, out, o)
    if ok then
      o = r
    else
      -- Drop what the batch had answered and committed before it failed.
      rollback()
      for j = #out, o + 1, -1 do out[j] = nil end
      o = o + 1
      if type(r) == 'table' and r.err then
        out[o] = r
      else
        out[o] = { err = tostring(r) }
      end
    end
    ko, ao = ko + nk, ao + 1 + n
  end
  write_states()
  return end_reply(o)
end
