-- fixed_window.lua: the twin of algorithm.Decide/Commit for fixed_window.
-- State: t = window start (µs), v = count, wend = window end (see load_fixed). A calendar
-- window (p.bounds set) takes its start and end from calendar_window; the others are aligned
-- to the epoch.

algorithms[FIXED_WINDOW] = {
  decide = function(p, s, now, cost, r)
    local start, stop = fixed_window_bounds(p, now)
    if s.t ~= start then s.t, s.v, s.wend = start, 0, stop end
    clear_result(r)
    local count = s.v
    if cost > p.limit then
      r.reason = REASON_COST_EXCEEDS_CAPACITY
    elseif count + cost <= p.limit or cost == 0 then
      r.allowed = true
      count = count + cost
    else
      r.retry = stop - now
    end
    r.remaining = imax(0, p.limit - count)
    r.reset = stop - now
    return r
  end,
  commit = function(p, s, now, cost)
    s.v = s.v + cost
    if p.bounds then
      local _, stop = calendar_window(p, now)
      return stop
    end
    return s.t + p.period
  end,
}
