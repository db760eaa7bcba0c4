-- sliding_window_log.lua: the twin of algorithm.Decide/Commit for sliding_window_log.
-- State: v = sum of the log's costs; log = entries {at, cost}, oldest first, one per µs,
-- read from the list KEYS[log] whose elements are "at:cost". s.pruned counts entries dropped
-- from the head, so the write-back trims instead of rewriting.

algorithms[SLIDING_WINDOW_LOG] = {
  decide = function(p, s, now, cost, r)
    local log = s.log
    while s.head <= #log and log[s.head][1] <= now - p.period do
      s.v = s.v - log[s.head][2]
      s.head = s.head + 1
    end
    clear_result(r)
    local sum = s.v
    if cost > p.limit then
      r.reason = REASON_COST_EXCEEDS_CAPACITY
    elseif sum + cost <= p.limit or cost == 0 then
      r.allowed = true
      sum = sum + cost
    else
      local need, freed = sum + cost - p.limit, 0
      for i = s.head, #log do
        freed = freed + log[i][2]
        if freed >= need then
          r.retry = log[i][1] + p.period - now
          break
        end
      end
    end
    r.remaining = imax(0, p.limit - sum)
    if r.allowed and cost > 0 then
      r.reset = p.period
    elseif s.head <= #log then
      r.reset = log[#log][1] + p.period - now
    end
    return r
  end,
  commit = function(p, s, now, cost)
    local log = s.log
    local n = #log
    if n >= s.head and log[n][1] == now then
      log[n][2] = log[n][2] + cost
      if n <= s.loaded then s.last_changed = true end
    else
      log[n + 1] = { now, cost }
    end
    s.v = s.v + cost
    return now + p.period
  end,
}
