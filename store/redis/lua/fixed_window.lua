-- fixed_window.lua: the twin of algorithm.Decide/Commit for fixed_window.
-- State: t = window start (µs), v = count.

algorithms[FIXED_WINDOW] = {
  decide = function(p, s, now, cost, r)
    local start = window(p, now)
    if s.t ~= start then s.t, s.v = start, 0 end
    clear_result(r)
    local count = s.v
    if cost > p.limit then
      r.reason = REASON_COST_EXCEEDS_CAPACITY
    elseif count + cost <= p.limit or cost == 0 then
      r.allowed = true
      count = count + cost
    else
      r.retry = start + p.period - now
    end
    r.remaining = imax(0, p.limit - count)
    r.reset = start + p.period - now
    return r
  end,
  commit = function(p, s, now, cost)
    s.v = s.v + cost
    return s.t + p.period
  end,
}
