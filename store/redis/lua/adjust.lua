-- adjust.lua: settles a reservation on one hash slot, the twin of algorithm.Adjust: for each op
-- a delta > 0 gives that much back of what the reservation consumed at instant `at`, a delta <
-- 0 takes that much more even past the limit. It runs after prelude.lua, the six algorithm
-- files and batch.lua (for expire_string).
--
-- KEYS: per op, its state and its log list (as refund.lua: 2 per op).
-- ARGV: [1] now in µs, or '' for Redis TIME; [2] at, the reservation's instant (µs); [3] n;
--       then per op its string (see parse_op_slot; its cost is not read) and its delta. A
--       concurrency op's string names its lease's slot, renewed to its ttl or freed at ttl 0.
-- Reply: per op, 1 when its state changed, else 0.

-- adjust_fixed_start is the start of the window that holds t, or nil when a calendar window's
-- bounds (computed around now) do not hold t: then t is not in now's window either.
local function adjust_fixed_start(p, t)
  if not p.bounds then return window(p, t) end
  local b = p.bounds
  for i = 1, 3 do
    if b[i] <= t and t < b[i + 1] then return b[i] end
  end
  return nil
end

-- adjust_counter is algorithm counterGiveBack: the newest live bucket whose span holds at's
-- tick gives back up to delta, and goes when it is emptied.
local function adjust_counter(p, s, now, at, delta)
  if s.bn == 0 or s.bexp ~= p.tick_exp then return false end
  local at_t, from = ticks(p, at), ticks(p, now) - p.period_ticks
  local bf, bl, bc = counter_parse(s)
  for i = s.bn, 1, -1 do
    if bl[i] > from and bf[i] <= at_t and at_t <= bl[i] then
      local back = imin(bc[i], delta)
      local start = window(p, at)
      if s.t == start then
        s.v = imax(0, s.v - back)
      elseif s.t == start + p.period then
        s.w = imax(0, s.w - back)
      end
      if back < bc[i] then
        bc[i] = bc[i] - back
        counter_store(s, bf, bl, bc, s.bn)
      else
        for k = i, s.bn - 1 do
          bf[k], bl[k], bc[k] = bf[k + 1], bl[k + 1], bc[k + 1]
        end
        if s.bn == 1 then
          s.bn, s.bsum, s.blast, s.braw = 0, 0, nil, ''
        else
          counter_store(s, bf, bl, bc, s.bn - 1)
        end
      end
      return true
    end
  end
  return false
end

-- adjust_log is algorithm logGiveBack: the entry at at gives back up to delta, and goes when
-- it is emptied. decide pruned the log up to s.head.
local function adjust_log(s, at, delta)
  local log = s.log
  for j = #log, s.head, -1 do
    if log[j][1] == at then
      local back = imin(log[j][2], delta)
      s.v = s.v - back
      if back < log[j][2] then
        log[j][2] = log[j][2] - back
      else
        table.remove(log, j)
      end
      return true
    end
  end
  return false
end

-- adjust_one settles one op on s; it returns whether s changed and, when it took more, the
-- instant s is fresh again.
local function adjust_one(p, s, now, at, delta)
  p.decide(p, s, now, 0, {})
  if delta < 0 then
    if p.limit == 0 then return false end
    local cap = p.limit
    if p.kind == TOKEN_BUCKET or p.kind == GCRA or p.kind == LEAKY_BUCKET then cap = p.burst end
    return true, p.commit(p, s, now, imin(-delta, cap))
  end
  if delta == 0 then return false end
  if p.kind == TOKEN_BUCKET or p.kind == GCRA or p.kind == LEAKY_BUCKET then
    delta = imin(delta, p.burst)
  else
    delta = imin(delta, p.limit)
  end
  if p.kind == TOKEN_BUCKET then
    if s.v >= p.capacity then return false end
    s.v = imin(p.capacity, s.v + delta * p.scale)
  elseif p.kind == LEAKY_BUCKET then
    if s.v <= 0 then return false end
    s.v = imax(0, s.v - delta * p.scale)
  elseif p.kind == GCRA then
    local now_t = ticks(p, now)
    local debt = gcra_debt(p, s, now_t)
    if debt <= 0 or p.rate == 0 then return false end
    debt = imax(0, debt - delta * p.scale)
    s.t, s.v = now_t + idiv(debt, p.rate), imod(debt, p.rate)
  elseif p.kind == FIXED_WINDOW then
    local start = adjust_fixed_start(p, now)
    if adjust_fixed_start(p, at) ~= start or s.t ~= start or s.v <= 0 then return false end
    s.v = imax(0, s.v - delta)
  elseif p.kind == SLIDING_WINDOW_LOG then
    return adjust_log(s, at, delta)
  elseif p.kind == SLIDING_WINDOW_COUNTER then
    return adjust_counter(p, s, now, at, delta)
  else
    return false
  end
  return true
end

-- adjust_key settles one op on its key's state and writes it back; it reports whether the
-- state changed.
local function adjust_key(p, key, log_key, now, at, delta)
  local s = load_state(key, log_key, p.kind, {}, p, now)
  local changed, idle = adjust_one(p, s, now, at, delta)
  if not changed then return false end
  local expire = nil
  if idle then expire = expire_string(idle) end
  save_state(s, expire)
  if p.kind == SLIDING_WINDOW_LOG then
    -- Rewritten whole: a give-back may remove an entry from the middle.
    local ttl = redis.call('PTTL', key)
    redis.call('DEL', log_key)
    for j = s.head, #s.log do
      redis.call('RPUSH', log_key, fmt(s.log[j][1]) .. ':' .. fmt(s.log[j][2]))
    end
    if ttl > 0 then redis.call('PEXPIRE', log_key, ttl) end
  end
  return true
end

local function adjust(KEYS, ARGV)
  bind_globals()
  local now = tonumber(ARGV[1])
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local at, n, out = tonumber(ARGV[2]), tonumber(ARGV[3]), {}
  for i = 1, n do
    local p, slot_id, slot_ttl = parse_op_slot(ARGV[2 + 2 * i])
    local delta = tonumber(ARGV[3 + 2 * i])
    local key, log_key = KEYS[2 * i - 1], KEYS[2 * i]
    local changed
    if p.kind == CONCURRENCY then
      -- A lease's slot is renewed (ttl > 0) or freed, whatever the delta.
      changed = slot_id ~= nil and settle_slot(log_key, now, slot_id, slot_ttl)
    else
      changed = adjust_key(p, key, log_key, now, at, delta)
    end
    out[i] = changed and 1 or 0
  end
  return out
end
