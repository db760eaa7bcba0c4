-- refund.lua: gives back what batch.lua consumed on one hash slot when a limit of the same
-- request on another slot denied (Redis Cluster cannot run one script across slots). It runs
-- after prelude.lua. A refund is exact unless the key changed in between (another request, a
-- refill past the cap); it never gives back more than was taken.
--
-- KEYS: as batch.lua, 2 per op. ARGV: [1] the now batch.lua used (µs); [2] n; then per op the
-- 12 values of batch.lua, cost being what to give back (0 for ops that consumed nothing).
-- Reply: per op, remaining and reset after the refund (what the op has left, as a look), so
-- the request reports the same numbers as an all-or-nothing store would.

local function fmt(x) return string.format('%d', x) end
local now, n, out = tonumber(ARGV[1]), tonumber(ARGV[2]), {}
for i = 1, n do
  local b = 2 + (i - 1) * 12
  local p = read_params(b)
  local cost = tonumber(ARGV[b + 11])
  local key, log_key = KEYS[2 * i - 1], KEYS[2 * i]
  local h = redis.call('HMGET', key, 't', 'v', 'w')
  local t, v, w = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])
  if cost > 0 and v then
    local inc = cost * p.scale
    local start = window(p, now)
    if p.kind == TOKEN_BUCKET and w == fingerprint(p) then
      redis.call('HSET', key, 'v', fmt(imin(p.capacity, v + inc)))
    elseif p.kind == LEAKY_BUCKET and w == fingerprint(p) then
      redis.call('HSET', key, 'v', fmt(imax(0, v - inc)))
    elseif p.kind == GCRA and w == fingerprint(p) then
      local total = imax(ticks(p, now) * p.rate, t * p.rate + v - inc)
      redis.call('HSET', key, 't', fmt(idiv(total, p.rate)), 'v', fmt(imod(total, p.rate)))
    elseif p.kind == FIXED_WINDOW and t == start then
      redis.call('HSET', key, 'v', fmt(imax(0, v - cost)))
    elseif p.kind == SLIDING_WINDOW_COUNTER and t == start then
      redis.call('HSET', key, 'v', fmt(imax(0, v - cost)))
    elseif p.kind == SLIDING_WINDOW_COUNTER and t == start + p.period then
      redis.call('HSET', key, 'w', fmt(imax(0, w - cost)))
    elseif p.kind == SLIDING_WINDOW_LOG then
      local raw = redis.call('LRANGE', log_key, 0, -1)
      for j = #raw, 1, -1 do
        local c = string.find(raw[j], ':', 1, true)
        local at, left = tonumber(string.sub(raw[j], 1, c - 1)), tonumber(string.sub(raw[j], c + 1))
        if at == now then
          left = left - imin(left, cost)
          if left > 0 then
            redis.call('LSET', log_key, j - 1, fmt(at) .. ':' .. fmt(left))
          else
            -- An entry with nothing left is no entry: mark it, then remove the mark.
            redis.call('LSET', log_key, j - 1, 'refunded')
            redis.call('LREM', log_key, 1, 'refunded')
          end
          redis.call('HSET', key, 'v', fmt(imax(0, v - cost)))
              break
        end
      end
    end
  end
end
-- Look only once everything is given back: two ops may share a key.
for i = 1, n do
  local p = read_params(2 + (i - 1) * 12)
  local r = algorithms[p.kind].decide(p, load_state(KEYS[2 * i - 1], KEYS[2 * i], p.kind), now, 0)
  out[#out + 1] = r.remaining
  out[#out + 1] = r.reset
end
return out
