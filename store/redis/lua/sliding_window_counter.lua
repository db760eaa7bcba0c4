-- sliding_window_counter.lua: the twin of algorithm.Decide/Commit for sliding_window_counter.
-- State: t = current window start (µs), v = current count, w = previous count (kept for the
-- region sync), and the buckets of the admissions in the last period, which it decides on: all
-- of every live bucket but the oldest, and of the oldest the share of its span [first, last]
-- after the window's start, rounded up.
--
-- The buckets stay the text they are stored as (see load_buckets): s.blast the newest,
-- "first,last,count", and s.braw the others, oldest first with ';' between; s.bn counts them
-- all, s.bsum sums their counts, s.bexp is their tick exponent. A decision reads only the
-- buckets at the front (the expired ones and the oldest live one; a denial a few more) and the
-- newest, and a commit rewrites only the newest: a call does not convert twenty buckets of
-- numbers back and forth.

local COUNTER_BUCKETS, COUNTER_SLOTS = 20, 22

-- bucket_at reads the bucket of text that starts at pos: first, last, count, and where the
-- next one starts.
local function bucket_at(text, pos)
  local f, l, c, nxt = string.match(text, '^([^,]*),([^,]*),([^;]*);?()', pos)
  return tonumber(f), tonumber(l), tonumber(c), nxt
end

-- bucket i of s (1 the oldest), which starts at pos in s.braw unless it is the newest.
local function bucket_of(s, i, pos)
  if i < s.bn then return bucket_at(s.braw, pos) end
  return bucket_at(s.blast, 1)
end

local function bucket_text(f, l, c)
  return string.format('%d,%d,%d', f, l, c)
end

-- counter_parse reads every bucket into arrays, for the rare changes that touch them all.
local function counter_parse(s)
  local bf, bl, bc, pos = {}, {}, {}, 1
  for i = 1, s.bn do
    bf[i], bl[i], bc[i], pos = bucket_of(s, i, pos)
  end
  return bf, bl, bc
end

-- counter_store writes n buckets from arrays back into s.
local function counter_store(s, bf, bl, bc, n)
  local out, sum = {}, 0
  for i = 1, n do
    out[i] = bucket_text(bf[i], bl[i], bc[i])
    sum = sum + bc[i]
  end
  s.blast = out[n]
  s.braw, s.bn, s.bsum = table.concat(out, ';', 1, n - 1), n, sum
end

-- counter_convert rewrites the buckets into p's tick (algorithm convertBuckets): first rounded
-- down and last up.
local function counter_convert(p, s)
  local bf, bl, bc = counter_parse(s)
  for i = 1, s.bn do
    local f, l = bf[i], bl[i]
    for _ = p.tick_exp + 1, s.bexp do f, l = f * 10, l * 10 + 9 end
    for _ = s.bexp + 1, p.tick_exp do f, l = idiv(f, 10), ceil_div(l, 10) end
    bf[i], bl[i] = f, l
  end
  counter_store(s, bf, bl, bc, s.bn)
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
    local b = s
    if s.bn > 0 and s.bexp ~= p.tick_exp then
      -- Another period changed the tick: decide on the buckets converted, which commit
      -- stores; a look leaves them as they are (a sibling op may read them in their tick).
      b = { braw = s.braw, blast = s.blast, bn = s.bn, bsum = s.bsum, bexp = s.bexp }
      counter_convert(p, b)
    end
    -- Past the expired buckets to the oldest live one, i (f, l, c); sum is the live ones'.
    local n, sum, pos, i = b.bn, b.bsum, 1, 1
    local f, l, c, nxt
    while i <= n do
      f, l, c, nxt = bucket_of(b, i, pos)
      if l > from then break end
      sum, pos, i = sum - c, nxt, i + 1
    end
    local estimate = sum
    if i <= n and from >= f then
      estimate = estimate - (c - ceil_div(c * (l - from), l - f))
    end
    clear_result(r)
    if cost > p.limit then
      r.reason = REASON_COST_EXCEEDS_CAPACITY
    elseif estimate + cost <= p.limit or cost == 0 then
      r.allowed = true
      estimate = estimate + cost
    else
      -- The earliest tick the window's start may pass for cost to fit (algorithm counterFits).
      local before, fits = sum, 0
      for j = i, n do
        if j > i then f, l, c, nxt = bucket_of(b, j, nxt) end
        before = before - c
        local room = p.limit - cost - before
        if room >= 0 then
          if f == l then
            fits = l
          else
            fits = l - idiv(room * (l - f), c)
          end
          break
        end
      end
      r.retry = after(p, now_t, fits + p.period_ticks - now_t, now)
    end
    r.remaining = imax(0, p.limit - estimate)
    if r.allowed and cost > 0 then
      r.reset = after(p, now_t, p.period_ticks, now)
    elseif i <= n then
      local _, last = bucket_at(b.blast, 1)
      r.reset = after(p, now_t, last + p.period_ticks - now_t, now)
    end
    return r
  end,
  commit = function(p, s, now, cost)
    s.v = s.v + cost
    if s.bn > 0 and s.bexp ~= p.tick_exp then counter_convert(p, s) end
    s.bexp = p.tick_exp
    local now_t = ticks(p, now)
    local from = now_t - p.period_ticks
    -- Drop the expired buckets from the front.
    local n, sum, pos, i = s.bn, s.bsum, 1, 1
    while i <= n do
      local _, l, c, nxt = bucket_of(s, i, pos)
      if l > from then break end
      sum, pos, i = sum - c, nxt, i + 1
    end
    if i > n then
      s.braw, s.blast, n = '', nil, 0
    elseif i == n then
      s.braw, n = '', 1
    elseif i > 1 then
      s.braw, n = string.sub(s.braw, pos), n - i + 1
    end
    s.bn, s.bsum = n, sum
    if n > 0 then
      local f, l, c = bucket_at(s.blast, 1)
      if l >= now_t or c + cost <= imax(1, ceil_div(p.limit, COUNTER_BUCKETS)) then
        s.blast, s.bsum = bucket_text(f, imax(l, now_t), c + cost), sum + cost
        return s.t + 2 * p.period
      end
    end
    if n == COUNTER_SLOTS then
      -- Merge the adjacent pair with the least count (the oldest such), as mergeBuckets.
      local bf, bl, bc = counter_parse(s)
      local j = 1
      for k = 2, n - 1 do
        if bc[k] + bc[k + 1] < bc[j] + bc[j + 1] then j = k end
      end
      bl[j], bc[j] = bl[j + 1], bc[j] + bc[j + 1]
      for k = j + 1, n - 1 do
        bf[k], bl[k], bc[k] = bf[k + 1], bl[k + 1], bc[k + 1]
      end
      n = n - 1
      counter_store(s, bf, bl, bc, n)
    end
    if n > 1 then
      s.braw = s.braw .. ';' .. s.blast
    elseif n == 1 then
      s.braw = s.blast
    end
    s.blast, s.bn, s.bsum = bucket_text(now_t, now_t, cost), n + 1, s.bsum + cost
    return s.t + 2 * p.period
  end,
}

-- counter_refund gives cost back from the newest bucket when the admission refunded is in it
-- (its last tick is now): refund.lua's part of the buckets. A bucket emptied goes, as if the
-- commit had not opened it. It is exact but for a commit that added to a bucket opened
-- before (its last tick stays now: the units count as later, never fewer) or merged two.
local function counter_refund(p, s, now, cost)
  if s.bn == 0 or s.bexp ~= p.tick_exp then return end
  local f, l, c = bucket_at(s.blast, 1)
  if l ~= ticks(p, now) then return end
  local back = imin(c, cost)
  s.bsum = s.bsum - back
  if c > back then
    s.blast = bucket_text(f, l, c - back)
  elseif s.bn == 1 then
    s.bn, s.blast, s.braw = 0, nil, ''
  else
    -- The last of the others becomes the newest.
    local lp, k = 1, string.find(s.braw, ';', 1, true)
    while k do
      lp = k + 1
      k = string.find(s.braw, ';', lp, true)
    end
    s.blast = string.sub(s.braw, lp)
    if lp > 1 then s.braw = string.sub(s.braw, 1, lp - 2) else s.braw = '' end
    s.bn = s.bn - 1
  end
end
