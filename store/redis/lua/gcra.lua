-- gcra.lua: the twin of algorithm.Decide/Commit for gcra.
-- State: t = TAT (whole ticks), v = TAT fraction (1/rate tick), w = fingerprint.

local function gcra_normalize(p, s, now)
  local now_t = ticks(p, now)
  local fp = fingerprint(p)
  if s.w ~= fp then
    convert(p, s, now_t)
    s.w = fp
  end
  if s.t < now_t or (s.t == now_t and s.v == 0) then s.t, s.v = now_t, 0 end
  return now_t
end

-- gcra_debt is max(TAT, now) - now in 1/rate ticks.
local function gcra_debt(p, s, now_t)
  if s.t < now_t then return 0 end
  return (s.t - now_t) * p.rate + s.v
end

algorithms[GCRA] = {
  decide = function(p, s, now, cost, r)
    local now_t = gcra_normalize(p, s, now)
    return bucket_result(p, p.capacity - gcra_debt(p, s, now_t), cost, now_t, now, r)
  end,
  commit = function(p, s, now, cost)
    local now_t = ticks(p, now)
    local debt = gcra_debt(p, s, now_t) + cost * p.scale
    s.t, s.v = now_t + idiv(debt, p.rate), imod(debt, p.rate)
    return (s.t + 1) * p.tick
  end,
}
