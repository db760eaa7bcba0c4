-- prelude.lua: the arithmetic the six algorithms share, ported from algorithm/*.go.
-- Every value is an integer below 2^52, which a Lua double holds exactly, and every division is
-- floored on non-negative operands, so each result equals the Go integer result bit for bit.
-- Params p: kind, limit, burst, period, tick, tick_exp, period_ticks, scale, rate, capacity.
-- State s: t, v, w (integers, as in algorithm.State), log (sliding_window_log entries).
-- Stored as the string "t:v:w" under the bucket key, and the log as a list beside it.
-- Result r: allowed, reason, remaining, reset, retry, delay (durations in µs from now).

-- floor is math.floor, bound by each entry point when it is called (bind_math): a Function
-- library may not touch math while it loads, and a wrapper looking it up on every use was a
-- measurable part of a call.
local floor
local function bind_math() floor = math.floor end
local TOKEN_BUCKET, GCRA, LEAKY_BUCKET, FIXED_WINDOW, SLIDING_WINDOW_LOG, SLIDING_WINDOW_COUNTER = 1, 2, 3, 4, 5, 6
local REASON_NONE, REASON_COST_EXCEEDS_CAPACITY = 0, 1

local function idiv(a, b) return floor(a / b) end
local function imod(a, b) return a % b end -- Lua's % is a - floor(a/b)*b
local function ceil_div(a, b) return floor((a + b - 1) / b) end
local function imax(a, b) if a > b then return a end return b end
local function imin(a, b) if a < b then return a end return b end

local function new_result()
  return { allowed = false, reason = REASON_NONE, remaining = 0, reset = 0, retry = 0, delay = 0 }
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
local function bucket_result(p, avail, cost, now_t, now)
  local r = new_result()
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

-- window is the start (µs) of the epoch-aligned window of p.period that holds now.
local function window(p, now) return now - imod(now, p.period) end

-- load_state reads a key's state, stored as the string "t:v:w" (one GET is several times
-- cheaper inside a script than a hash's HMGET), and for sliding_window_log the entries of its
-- log list ("at:cost" elements). A missing key is a fresh state.
local function load_state(key, log_key, kind)
  local s = { t = 0, v = 0, w = 0, log = {}, head = 1, loaded = 0, idle = 0, key = key, log_key = log_key, kind = kind }
  local raw = redis.call('GET', key)
  if raw then
    local t, v, w = string.match(raw, '^(-?%d+):(-?%d+):(-?%d+)$')
    s.t, s.v, s.w = tonumber(t), tonumber(v), tonumber(w)
  end
  if kind == SLIDING_WINDOW_LOG then
    local entries = redis.call('LRANGE', log_key, 0, -1)
    for j, e in ipairs(entries) do
      local c = string.find(e, ':', 1, true)
      s.log[j] = { tonumber(string.sub(e, 1, c - 1)), tonumber(string.sub(e, c + 1)) }
    end
    s.loaded = #entries
  end
  return s
end

local function fmt(x) return string.format('%d', x) end

-- save_state writes t:v:w, expiring at expire (ms, a string) or keeping the key's TTL.
local function save_state(s, expire)
  local value = string.format('%d:%d:%d', s.t, s.v, s.w)
  if expire then
    redis.call('SET', s.key, value, 'PXAT', expire)
  else
    redis.call('SET', s.key, value, 'KEEPTTL')
  end
end

-- parse_params reads a limit's parameters, sent as one string
-- "kind,limit,burst,period,tick,tick_exp,period_ticks,scale,rate,capacity". Loaded as a Redis
-- Function, the library keeps the parsed tables across calls: a policy has few distinct limits.
local param_cache, param_cache_size = {}, 0
local function parse_params(str)
  local p = param_cache[str]
  if p then return p end
  local v = {}
  for x in string.gmatch(str, '[^,]+') do v[#v + 1] = tonumber(x) end
  p = { kind = v[1], limit = v[2], burst = v[3], period = v[4], tick = v[5], tick_exp = v[6],
        period_ticks = v[7], scale = v[8], rate = v[9], capacity = v[10] }
  if param_cache_size >= 10000 then param_cache, param_cache_size = {}, 0 end
  param_cache[str], param_cache_size = p, param_cache_size + 1
  return p
end

local algorithms = {}
