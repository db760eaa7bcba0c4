-- sliding_window_counter.lua: the twin of algorithm.Decide/Commit for sliding_window_counter.
-- State: t = current window start (µs), v = current count, w = previous count (kept for the
-- region sync), and the buckets of the admissions in the last period (bf, bl, bc, bn, bexp; see
-- load_buckets), which it decides on: all of every live bucket but the oldest, and of the
-- oldest the share of its span [first, last] after the window's start, rounded up.

local COUNTER_BUCKETS, COUNTER_SLOTS = 20, 22

-- counter_live is the index of the first bucket with a unit after tick from.
local function counter_live(s, from)
  local i, bl = 1, s.bl
  while i <= s.bn and bl[i] <= from do i = i + 1 end
  return i
end

-- counter_convert rewrites the buckets into p's tick (algorithm convertBuckets): first rounded
-- down and last up.
local function counter_convert(p, s)
  for i = 1, s.bn do
    local f, l = s.bf[i], s.bl[i]
    for _ = p.tick_exp + 1, s.bexp do f, l = f * 10, l * 10 + 9 end
    for _ = s.bexp + 1, p.tick_exp do f, l = idiv(f, 10), ceil_div(l, 10) end
    s.bf[i], s.bl[i] = f, l
  end
  s.bexp = p.tick_exp
end

algorithms[SLIDING_WINDOW_COUNTER] = {
  decide = function(p, s, now, cost, r)
    local start = window(p, now)
    if s.t ~= start then
      if s.t == start - p.period then s.w = s.v else s.w = 0 end
      s.t, s.v = start, 0
    end
    local now_t = ticks(p, now)
    local from = now_t - p.period_ticks
    if s.bn > 0 and s.bexp ~= p.tick_exp then counter_convert(p, s) end
    local h, bn, bf, bl, bc = counter_live(s, from), s.bn, s.bf, s.bl, s.bc
    local estimate = 0
    for i = h, bn do estimate = estimate + bc[i] end
    if h <= bn and from >= bf[h] then
      estimate = estimate - (bc[h] - ceil_div(bc[h] * (bl[h] - from), bl[h] - bf[h]))
    end
    clear_result(r)
    if cost > p.limit then
      r.reason = REASON_COST_EXCEEDS_CAPACITY
    elseif estimate + cost <= p.limit or cost == 0 then
      r.allowed = true
      estimate = estimate + cost
    else
      -- The earliest tick the window's start may pass for cost to fit (algorithm counterFits).
      local before, fits = 0, bl[bn]
      for i = h, bn do before = before + bc[i] end
      for i = h, bn do
        before = before - bc[i]
        local room = p.limit - cost - before
        if room >= 0 then
          if bf[i] == bl[i] then
            fits = bl[i]
          else
            fits = bl[i] - idiv(room * (bl[i] - bf[i]), bc[i])
          end
          break
        end
      end
      r.retry = after(p, now_t, fits + p.period_ticks - now_t, now)
    end
    r.remaining = imax(0, p.limit - estimate)
    if r.allowed and cost > 0 then
      r.reset = after(p, now_t, p.period_ticks, now)
    elseif h <= bn then
      r.reset = after(p, now_t, bl[bn] + p.period_ticks - now_t, now)
    end
    return r
  end,
  commit = function(p, s, now, cost)
    s.v = s.v + cost
    if not s.bf then s.bf, s.bl, s.bc = {}, {}, {} end
    if s.bn > 0 and s.bexp ~= p.tick_exp then counter_convert(p, s) end
    s.bexp = p.tick_exp
    local now_t = ticks(p, now)
    local bf, bl, bc = s.bf, s.bl, s.bc
    local h = counter_live(s, now_t - p.period_ticks)
    if h > 1 then
      for i = h, s.bn do
        bf[i - h + 1], bl[i - h + 1], bc[i - h + 1] = bf[i], bl[i], bc[i]
      end
      s.bn = s.bn - (h - 1)
    end
    local n = s.bn
    if n > 0 and (bl[n] >= now_t or bc[n] + cost <= imax(1, ceil_div(p.limit, COUNTER_BUCKETS))) then
      bc[n] = bc[n] + cost
      bl[n] = imax(bl[n], now_t)
    else
      if n == COUNTER_SLOTS then
        -- Merge the adjacent pair with the least count (the oldest such), as mergeBuckets.
        local j = 1
        for i = 2, n - 1 do
          if bc[i] + bc[i + 1] < bc[j] + bc[j + 1] then j = i end
        end
        bl[j], bc[j] = bl[j + 1], bc[j] + bc[j + 1]
        for i = j + 1, n - 1 do
          bf[i], bl[i], bc[i] = bf[i + 1], bl[i + 1], bc[i + 1]
        end
        n = n - 1
      end
      n = n + 1
      bf[n], bl[n], bc[n] = now_t, now_t, cost
      s.bn = n
    end
    return s.t + 2 * p.period
  end,
}

-- counter_refund gives cost back from the newest bucket when the admission refunded is in it
-- (its last tick is now): refund.lua's part of the buckets.
local function counter_refund(p, s, now, cost)
  local n = s.bn
  if n == 0 or s.bexp ~= p.tick_exp or s.bl[n] ~= ticks(p, now) then return end
  local left = s.bc[n] - imin(s.bc[n], cost)
  if left > 0 then s.bc[n] = left else s.bn = n - 1 end
end
