-- prelude.lua: the arithmetic the six algorithms share, ported from algorithm/*.go.
-- Every value is an integer below 2^52, which a Lua double holds exactly, and every division is
-- floored on non-negative operands, so each result equals the Go integer result bit for bit.
-- Op p: an op's limit (kind, limit, burst, period, tick, tick_exp, period_ticks, scale, rate,
-- capacity), its cost and mode (see parse_op).
-- State s: t, v, w (integers, as in algorithm.State), log (sliding_window_log entries).
-- Stored as the string "t:v:w" under the bucket key, and the log as a list beside it; a
-- fixed_window's count as a hash field instead (see load_state).
-- Result r: allowed, reason, remaining, reset, retry, delay (durations in µs from now).
--
-- Creating a table costs about as much inside Redis as a GET, so the hot path makes none: the
-- entry points keep their state and result tables and per-op arrays between batches (and, in a
-- Function library, between calls) and overwrite them.

-- floor is math.floor and call redis.call, bound by each entry point when it is called
-- (bind_globals): a Function library may not touch math or redis.call while it loads, and a
-- wrapper looking them up on every use was a measurable part of a call. The hot paths (a
-- state's GET and SET) use call; the rest looks redis.call up.
local floor, call, pcall_redis
local function bind_globals() floor, call, pcall_redis = math.floor, redis.call, redis.pcall end
local TOKEN_BUCKET, GCRA, LEAKY_BUCKET, FIXED_WINDOW, SLIDING_WINDOW_LOG, SLIDING_WINDOW_COUNTER = 1, 2, 3, 4, 5, 6
local CONCURRENCY = 7
-- MAX_SLOT_WAIT bounds a concurrency result's waits, as algorithm's maxSlotWait (MaxPeriod).
local MAX_SLOT_WAIT = 400 * 24 * 3600 * 1000000
local REASON_NONE, REASON_COST_EXCEEDS_CAPACITY = 0, 1

local function idiv(a, b) return floor(a / b) end
local function imod(a, b) return a % b end -- Lua's % is a - floor(a/b)*b
local function ceil_div(a, b) return floor((a + b - 1) / b) end
local function imax(a, b) if a > b then return a end return b end
local function imin(a, b) if a < b then return a end return b end

-- clear_result makes r a fresh result: each algorithm's decide starts with it.
local function clear_result(r)
  r.allowed, r.reason, r.remaining, r.reset, r.retry, r.delay = false, REASON_NONE, 0, 0, 0, 0
  return r
end

-- after is the time in µs from now until tick now_t+k begins, never negative.
local function after(p, now_t, k, now) return imax(0, (now_t + k) * p.tick - now) end

local function ticks(p, now)
  if p.tick == 1 then return now end
  return idiv(now, p.tick)
end

-- fingerprint: the unit bucket state is written in (never 0, so a zero state is fresh).
local function fingerprint(p)
  local unit = p.scale
  if p.kind == GCRA then
    unit = p.rate
    if unit == 0 then unit = 1 end
  end
  return unit * 8 + p.tick_exp
end

-- bucket_result decides cost against avail sub-units: the one decision the three bucket
-- encodings share.
local function bucket_result(p, avail, cost, now_t, now, r)
  clear_result(r)
  if cost > p.burst then
    r.reason = REASON_COST_EXCEEDS_CAPACITY
    cost = 0
  end
  local inc = cost * p.scale
  if r.reason ~= REASON_NONE then
  elseif inc <= avail or cost == 0 then -- a look is always allowed, even over a lowered limit
    r.allowed = true
    avail = avail - inc
  else
    r.retry = after(p, now_t, ceil_div(inc - avail, p.rate), now)
  end
  if p.rate > 0 then
    r.reset = after(p, now_t, ceil_div(p.capacity - avail, p.rate), now)
  end
  r.remaining = idiv(imax(0, avail), p.scale)
  return r
end

-- convert rewrites bucket state written under another fingerprint into p's units, rounding
-- against the caller; false when s held no state.
local function convert(p, s, now_t)
  if s.w == 0 then return false end
  local old_unit, old_exp = idiv(s.w, 8), imod(s.w, 8)
  local function to_ticks(t)
    for _ = p.tick_exp + 1, old_exp do t = t * 10 end
    for _ = old_exp + 1, p.tick_exp do t = idiv(t, 10) end
    return t
  end
  if p.kind == TOKEN_BUCKET then
    local tokens = imin(idiv(s.v, old_unit), p.burst)
    s.t, s.v = imin(to_ticks(s.t), now_t), tokens * p.scale
  elseif p.kind == LEAKY_BUCKET then
    local level = imin(ceil_div(s.v, old_unit), p.burst)
    s.t, s.v = imin(to_ticks(s.t), now_t), level * p.scale
  elseif p.kind == GCRA then
    local tat = s.t
    if s.v > 0 then tat = tat + 1 end
    s.t, s.v = to_ticks(tat), 0
    if p.tick_exp > old_exp then s.t = s.t + 1 end
  end
  return true
end

-- window is the start (µs) of the epoch-aligned window of p.period that holds now (% as in
-- imod, written out: a call less on every window op).
local function window(p, now) return now - now % p.period end

-- calendar_window is the start and end (µs) of the calendar window that holds now, picked from
-- the op's bounds b (algorithm.CalendarBounds: the previous, current and next windows, computed
-- in Go from the time zone's rules around the node's clock). A node whose clock is more than a
-- window off Redis's sends bounds that miss now: an error, never a wrong window.
local function calendar_window(p, now)
  local b = p.bounds
  for i = 1, 3 do
    if b[i] <= now and now < b[i + 1] then return b[i], b[i + 1] end
  end
  error(string.format('sluice: calendar window bounds %d..%d do not hold now %d (node clock far from Redis TIME)', b[1], b[4], now))
end

-- NO_LOG is the log of every state but sliding_window_log's: always empty, never written.
local NO_LOG = {}

-- number reads a decimal integer, nil for anything else. The parts of the states a call reads
-- repeat (a window's start, a small count, a fingerprint), as do batch heads, and a table
-- lookup of an interned string is several times cheaper than tonumber's strtod, so they are
-- kept, a bounded number of them.
local numbers, numbers_size = {}, 0
local function number(str)
  local x = numbers[str]
  if x then return x end
  x = tonumber(str)
  if not x then return nil end
  if numbers_size >= 4096 then numbers, numbers_size = {}, 0 end
  numbers[str], numbers_size = x, numbers_size + 1
  return x
end

-- A sliding_window_counter's buckets (algorithm.Bucket) follow its t:v:w after a colon, as
-- "tick_exp,n,sum;newest;oldest;...": their tick exponent, number and the sum of their counts,
-- then the newest bucket, then the others oldest first, each "first,last,count", ticks
-- absolute. load_buckets keeps the buckets as text (see sliding_window_counter.lua): the newest
-- in s.blast, the others in s.braw; the rest in s.bexp, s.bn, s.bsum.
local function load_buckets(s, rest)
  local e, n, sum, last, braw = string.match(rest, '^([^,]*),([^,]*),([^;]*);([^;]*);?(.*)$')
  s.bexp, s.bn, s.bsum, s.blast, s.braw = tonumber(e), tonumber(n), tonumber(sum), last, braw
end

local function bucket_string(s)
  local head = string.format('%d,%d,%d;', s.bexp, s.bn, s.bsum) .. s.blast
  if s.braw == '' then return head end
  return head .. ';' .. s.braw
end

local function fmt(x) return string.format('%d', x) end

-- decimal is fmt kept, as number keeps tonumber: the states a call writes hold the same parts
-- again and again, and a lookup costs a fraction of string.format.
local decimals, decimals_size = {}, 0
local function decimal(x)
  local str = decimals[x]
  if str then return str end
  str = fmt(x)
  if decimals_size >= 4096 then decimals, decimals_size = {}, 0 end
  decimals[x], decimals_size = str, decimals_size + 1
  return str
end

-- fixed_window_bounds is the start and end (µs) of p's fixed window that holds now.
local function fixed_window_bounds(p, now)
  if p.bounds then return calendar_window(p, now) end
  local start = window(p, now)
  return start, start + p.period
end

-- A fixed_window's count lives in a hash at its key, one field per window named by the
-- window's start (µs, decimal), the key expiring when the window ends: then a node can count a
-- request far from its limit with plain commands (HINCRBY, PEXPIREAT; store/redis/plain.go)
-- rather than a script, and both meet on the same count. A field is written only for the
-- window that holds now, and one for a new window replaces the hash whole, so the hash holds
-- the current window alone. load_fixed reads p's window that holds now into s; a key that
-- still holds the "t:v:w" string of an earlier version is read as that string, and replaced
-- by the hash when written.
local function load_fixed(key, p, now, s)
  local start, stop = fixed_window_bounds(p, now)
  s.t, s.wend, s.t0, s.fresh = start, stop, start, true
  local raw = pcall_redis('HGET', key, decimal(start))
  if type(raw) == 'table' then
    raw = call('GET', key) -- WRONGTYPE: the string of an earlier version
    local t, v = string.match(raw or '', '^([^:]*):([^:]*):')
    if number(t) == start then s.v = number(v) or 0 end
  elseif raw then
    s.v, s.fresh = number(raw) or 0, false
  end
  return s
end

-- load_state reads a key's state into s (a table of the caller's, every field overwritten),
-- stored as the string "t:v:w" (one GET is several times cheaper inside a script than a
-- hash's HMGET), and for sliding_window_log the entries of its log list ("at:cost"
-- elements). A missing key is a fresh state. A fixed_window's state is its window's at now
-- (load_fixed), which p and now name.
local function load_state(key, log_key, kind, s, p, now)
  s.t, s.v, s.w, s.log, s.head, s.loaded, s.idle = 0, 0, 0, NO_LOG, 1, 0, 0
  s.key, s.log_key, s.kind, s.dirty, s.last_changed = key, log_key, kind, false, false
  s.bn, s.bexp, s.bsum, s.braw, s.blast = 0, 0, 0, '', nil
  s.zread = false
  -- A concurrency key's slots are a sorted set at log_key, read by its decide.
  if kind == CONCURRENCY then return s end
  if kind == FIXED_WINDOW then return load_fixed(key, p, now, s) end
  local raw = call('GET', key)
  if raw then
    -- A character class matches at half the cost of %d+; a state that is not three integers
    -- still fails, at its first use as a number.
    local t, v, w, rest = string.match(raw, '^([^:]*):([^:]*):([^:]*):?(.*)$')
    s.t, s.v, s.w = number(t), number(v), number(w)
    if kind == SLIDING_WINDOW_COUNTER and rest ~= '' then load_buckets(s, rest) end
  end
  if kind == SLIDING_WINDOW_LOG then
    s.log = {}
    local entries = redis.call('LRANGE', log_key, 0, -1)
    for j, e in ipairs(entries) do
      local c = string.find(e, ':', 1, true)
      s.log[j] = { tonumber(string.sub(e, 1, c - 1)), tonumber(string.sub(e, c + 1)) }
    end
    s.loaded = #entries
  end
  return s
end

-- The value save_state wrote last and the numbers it was made of: states often differ from the
-- one written before in none of them (every fresh key of a window holds its start, 1 and 0).
local saved_t, saved_v, saved_w, saved_value = nil, nil, nil, nil

-- The window end (µs) a fixed_window's key expired at last, and the PEXPIREAT argument.
local fixed_end, fixed_expire = nil, nil

-- save_fixed writes a fixed_window's count (see load_fixed). The key expires at the last
-- millisecond that starts before the window ends (Redis drops a key once its time is past the
-- expiry), so a command of the next window finds no key; plain.go's commands expire it alike.
local function save_fixed(s)
  local field = decimal(s.t)
  if s.fresh or s.t ~= s.t0 then
    if s.wend ~= fixed_end then fixed_end, fixed_expire = s.wend, fmt(idiv(s.wend - 1, 1000)) end
    call('DEL', s.key)
    call('HSET', s.key, field, decimal(s.v))
    call('PEXPIREAT', s.key, fixed_expire)
    s.fresh, s.t0 = false, s.t
  else
    call('HSET', s.key, field, decimal(s.v))
  end
end

-- save_state writes t:v:w (and a counter's buckets), expiring at expire (ms, a string) or
-- keeping the key's TTL; a fixed_window's count, expiring with its window (save_fixed).
local function save_state(s, expire)
  if s.kind == FIXED_WINDOW then return save_fixed(s) end
  local t, v, w = s.t, s.v, s.w
  if t ~= saved_t or v ~= saved_v or w ~= saved_w then
    saved_t, saved_v, saved_w = t, v, w
    saved_value = decimal(t) .. ':' .. decimal(v) .. ':' .. decimal(w)
  end
  local value = saved_value
  if s.kind == SLIDING_WINDOW_COUNTER and s.bn > 0 then
    value = value .. ':' .. bucket_string(s)
  end
  if expire then
    call('SET', s.key, value, 'PXAT', expire)
  else
    call('SET', s.key, value, 'KEEPTTL')
  end
end

-- MODE_BINDING, MODE_SHADOW, MODE_COUNTER are an op's modes: a binding op's denial denies its
-- batch; a shadow op never does; a counter never denies, and keeps what it allowed whatever
-- the others decide. MODE_DRAIN is sent for a binding op that drains on deny; parse_op reads
-- it as MODE_BINDING with p.drains set.
local MODE_BINDING, MODE_SHADOW, MODE_COUNTER, MODE_DRAIN = 0, 1, 2, 3

local algorithms = {}

-- parse_op reads an op, sent as one string
-- "kind,limit,burst,period,tick,tick_exp,period_ticks,scale,rate,capacity,cost,mode", and for a
-- calendar fixed_window four bounds more (see calendar_window), kept as p.bounds. Loaded as
-- a Redis Function, the library keeps the parsed tables across calls: a policy has few distinct
-- limits, and most requests cost 1, so a call finds its ops here rather than converting a
-- dozen numbers each. The table also holds the op's algorithm's decide and commit and how many
-- KEYS it takes.
local op_cache, op_cache_size = {}, 0
local function parse_op(str)
  local p = op_cache[str]
  if p then return p end
  local v = {}
  for x in string.gmatch(str, '[^,]+') do v[#v + 1] = tonumber(x) end
  local calendar = #v == 16 and v[1] == FIXED_WINDOW
  if (#v ~= 12 and not calendar) or not algorithms[v[1]] then error('sluice: bad op ' .. str) end
  -- Mode 3 is a binding op that drains on deny (see drain in batch.lua).
  local mode, drains = v[12], v[12] == MODE_DRAIN
  if drains then mode = MODE_BINDING end
  p = { kind = v[1], limit = v[2], burst = v[3], period = v[4], tick = v[5], tick_exp = v[6],
        period_ticks = v[7], scale = v[8], rate = v[9], capacity = v[10], cost = v[11], mode = mode, drains = drains,
        decide = algorithms[v[1]].decide, commit = algorithms[v[1]].commit,
        nkeys = (v[1] == SLIDING_WINDOW_LOG or v[1] == CONCURRENCY) and 2 or 1 }
  if calendar then p.bounds = { v[13], v[14], v[15], v[16] } end
  if op_cache_size >= 10000 then op_cache, op_cache_size = {}, 0 end
  op_cache[str], op_cache_size = p, op_cache_size + 1
  return p
end

-- parse_op_slot is parse_op for an op string that may name a lease's slot after it,
-- "op|ttl|id" (a concurrency op of a reservation: store.Op.Slot); it returns the op, and the
-- lease id and ttl (µs), or nil and 0. Only the op part is cached: lease ids never repeat.
local function parse_op_slot(str)
  local p = op_cache[str]
  if p then return p, nil, 0 end
  local bar = string.find(str, '|', 1, true)
  if not bar then return parse_op(str), nil, 0 end
  local ttl, id = string.match(str, '^(%d+)|(.+)$', bar + 1)
  if not id then error('sluice: bad op slot ' .. str) end
  return parse_op(string.sub(str, 1, bar - 1)), id, tonumber(ttl)
end
