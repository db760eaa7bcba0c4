-- refund.lua: gives back what batch.lua consumed on one hash slot when a limit of the same
-- request on another slot denied (Redis Cluster cannot run one script across slots). It runs
-- after prelude.lua. A refund is exact unless the key changed in between (another request, a
-- refill past the cap); it never gives back more than was taken.
--
-- KEYS: as batch.lua, 2 per op; then, optionally, the idempotency record batch.lua wrote on this
-- slot, deleted: the request was not allowed after all, and only allowed requests are
-- remembered. ARGV: [1] the now batch.lua used (µs); [2] n; then per op its string as batch.lua
-- takes it (see parse_op), cost being what to give back (0 for ops that consumed nothing).
-- Reply: per op, remaining and reset after the refund (what the op has left, as a look), so
-- the request reports the same numbers as an all-or-nothing store would.

local function refund(KEYS, ARGV)
  bind_globals()
  local now, n, out = tonumber(ARGV[1]), tonumber(ARGV[2]), {}
  if KEYS[2 * n + 1] then redis.call('DEL', KEYS[2 * n + 1]) end
  for i = 1, n do
    local p, slot_id = parse_op_slot(ARGV[2 + i])
    local cost = p.cost
    local key, log_key = KEYS[2 * i - 1], KEYS[2 * i]
    local s = load_state(key, log_key, p.kind, {}, p, now)
    if p.kind == CONCURRENCY then
      -- The slot batch.lua took for the lease goes back whole.
      if cost > 0 and slot_id then redis.call('ZREM', log_key, slot_id) end
    elseif cost > 0 and redis.call('EXISTS', key) == 1 then
      local inc = cost * p.scale
      local start = window(p, now)
      if p.bounds then start = calendar_window(p, now) end
      local changed = true
      if p.kind == TOKEN_BUCKET and s.w == fingerprint(p) then
        s.v = imin(p.capacity, s.v + inc)
      elseif p.kind == LEAKY_BUCKET and s.w == fingerprint(p) then
        s.v = imax(0, s.v - inc)
      elseif p.kind == GCRA and s.w == fingerprint(p) then
        -- Relative to now, so no product leaves the exact range of a double.
        local now_t = ticks(p, now)
        local debt = imax(0, gcra_debt(p, s, now_t) - inc)
        s.t, s.v = now_t + idiv(debt, p.rate), imod(debt, p.rate)
      elseif p.kind == FIXED_WINDOW and not s.fresh then
        s.v = imax(0, s.v - cost)
      elseif p.kind == SLIDING_WINDOW_COUNTER and s.t == start then
        s.v = imax(0, s.v - cost)
        counter_refund(p, s, now, cost)
      elseif p.kind == SLIDING_WINDOW_COUNTER and s.t == start + p.period then
        s.w = imax(0, s.w - cost)
        counter_refund(p, s, now, cost)
      elseif p.kind == SLIDING_WINDOW_LOG then
        changed = false
        for j = #s.log, 1, -1 do
          local at, left = s.log[j][1], s.log[j][2]
          if at == now then
            left = left - imin(left, cost)
            if left > 0 then
              redis.call('LSET', log_key, j - 1, fmt(at) .. ':' .. fmt(left))
            else
              -- An entry with nothing left is no entry: mark it, then remove the mark.
              redis.call('LSET', log_key, j - 1, 'refunded')
              redis.call('LREM', log_key, 1, 'refunded')
            end
            s.v, changed = imax(0, s.v - cost), true
            break
          end
        end
      else
        changed = false
      end
      if changed then save_state(s, nil) end
    end
  end
  -- Look only once everything is given back: two ops may share a key.
  for i = 1, n do
    local p = parse_op_slot(ARGV[2 + i])
    local r = {}
    p.decide(p, load_state(KEYS[2 * i - 1], KEYS[2 * i], p.kind, {}, p, now), now, 0, r)
    out[#out + 1] = r.remaining
    out[#out + 1] = r.reset
  end
  return out
end
