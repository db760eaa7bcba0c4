-- sliding_window_counter.lua: the twin of algorithm.Decide/Commit for sliding_window_counter.
-- State: t = current window start (µs), v = current count, w = previous count.

algorithms[SLIDING_WINDOW_COUNTER] = {
  decide = function(p, s, now, cost, r)
    local start = window(p, now)
    if s.t ~= start then
      if s.t == start - p.period then s.w = s.v else s.w = 0 end
      s.t, s.v = start, 0
    end
    -- The estimate w·(1-f) + v, with f = e/pt, scaled by pt so it stays an integer.
    local pt = p.period_ticks
    local e = idiv(now - start, p.tick)
    local estimate = s.w * (pt - e) + s.v * pt
    local bound = p.limit * pt
    clear_result(r)
    local current = s.v
    if cost > p.limit then
      r.reason = REASON_COST_EXCEEDS_CAPACITY
    elseif estimate + cost * pt <= bound or cost == 0 then
      r.allowed = true
      estimate = estimate + cost * pt
      current = current + cost
    elseif s.v + cost <= p.limit then
      local need = pt - idiv((p.limit - s.v - cost) * pt, s.w)
      r.retry = start + need * p.tick - now
    else
      local need = pt - idiv((p.limit - cost) * pt, s.v)
      r.retry = start + p.period + need * p.tick - now
    end
    r.remaining = idiv(imax(0, bound - estimate), pt)
    if current > 0 then
      r.reset = start + 2 * p.period - now
    elseif s.w > 0 then
      r.reset = start + p.period - now
    end
    return r
  end,
  commit = function(p, s, now, cost)
    s.v = s.v + cost
    return s.t + 2 * p.period
  end,
}
