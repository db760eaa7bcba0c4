-- leaky_bucket.lua: the twin of algorithm.Decide/Commit for leaky_bucket.
-- State: t = last leak (ticks), v = level (1/scale units), w = fingerprint.

local function leak(p, s, now)
  local now_t = ticks(p, now)
  local fp = fingerprint(p)
  if s.w ~= fp then
    if not convert(p, s, now_t) then s.t, s.v = now_t, 0 end
    s.w = fp
  end
  if now_t > s.t then
    if s.v > 0 and p.rate > 0 then
      if now_t - s.t >= ceil_div(s.v, p.rate) then
        s.v = 0
      else
        s.v = s.v - (now_t - s.t) * p.rate
      end
    end
    s.t = now_t
  end
  return now_t
end

algorithms[LEAKY_BUCKET] = {
  decide = function(p, s, now, cost, r)
    local now_t = leak(p, s, now)
    bucket_result(p, p.capacity - s.v, cost, now_t, now, r)
    if r.allowed and cost > 0 and s.v > 0 then
      r.delay = after(p, now_t, ceil_div(s.v, p.rate), now)
    end
    return r
  end,
  commit = function(p, s, now, cost)
    s.v = s.v + cost * p.scale
    return (s.t + ceil_div(s.v, imax(p.rate, 1))) * p.tick
  end,
}
