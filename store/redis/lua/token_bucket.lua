-- token_bucket.lua: the twin of algorithm.Decide/Commit for token_bucket.
-- State: t = last refill (ticks), v = tokens (1/scale units), w = fingerprint.

local function refill(p, s, now)
  local now_t = ticks(p, now)
  local fp = fingerprint(p)
  if s.w ~= fp then
    if not convert(p, s, now_t) then s.t, s.v = now_t, p.capacity end
    s.w = fp
  end
  if now_t > s.t then
    local missing = p.capacity - s.v
    if missing > 0 and p.rate > 0 then
      if now_t - s.t >= ceil_div(missing, p.rate) then
        s.v = p.capacity
      else
        s.v = s.v + (now_t - s.t) * p.rate
      end
    end
    s.t = now_t
  end
  s.v = imin(s.v, p.capacity)
  return now_t
end

algorithms[TOKEN_BUCKET] = {
  decide = function(p, s, now, cost, r)
    local now_t = refill(p, s, now)
    return bucket_result(p, s.v, cost, now_t, now, r)
  end,
  commit = function(p, s, now, cost)
    s.v = s.v - cost * p.scale
    return (s.t + ceil_div(p.capacity - s.v, imax(p.rate, 1))) * p.tick
  end,
}
