-- batch.lua: decides a batch of limits at one instant and consumes all of them only if every
-- non-shadow limit allows (docs/architecture.md, Store batch: a denied request consumes nothing), as store/memory does.
-- It follows prelude.lua and the six algorithm files, in one script or one Redis Function
-- library, and defines batch(KEYS, ARGV).
--
-- KEYS: per op, its state ("t:v:w", a fixed_window's hash: see load_fixed), then, for a sliding_window_log op only, its log list;
--       then, when the batch has an idempotency TTL, the idempotency record.
-- ARGV: [1] the head: "n", the number of ops, when the batch has n KEYS, no idempotency and
--       uses Redis TIME (the production case, read through number's cache); else
--       "n,nk,now,ttl,fp": nk the number of KEYS, now in µs or '' to read Redis TIME (the
--       default, so Sluice nodes' clocks do not matter), ttl the idempotency TTL in ms (0 for
--       none), fp the request's fingerprint (hex, '' without a TTL). Then one string per op
--       (see parse_op).
-- Reply: status, now, then per op: code, remaining, reset, then retry when code has 2, then
--        delay when code has 4; code = 1 (allowed) + 2 (retry follows) + 4 (delay follows) +
--        8 × reason. An absent retry or delay is 0. Values left out cost Redis nothing to send
--        or Sluice to read, and most ops have neither. status is 0 (decided now), 1 (the
--        record's answer) or 2 (the record holds another fingerprint: the key was reused for
--        another request; nothing decided, no op values).

local DECIDED, REPLAYED, MISMATCH = 0, 1, 2

-- UNDO_WIDTH is how many values an op's undo record holds (see batch_at).
local UNDO_WIDTH = 13

-- The scratch of batch_at, overwritten by each batch (see prelude.lua): per op i, its op, its
-- state, its result and the expiry its commit asked for (set only by a commit); the undo
-- records; op_done, how many ops of the running batch have been decided (see rollback); look,
-- the result of a look after a denial.
local op_p, op_s, op_r, op_idle, undo, look = {}, {}, {}, {}, {}, {}
local op_done = 0

-- The states a call has read, by key, and in the order it read them. The batches of one call
-- share them: a key that several requests of the call use (a tenant's, an endpoint's, the
-- global one) is read once and written once per call rather than once per request, which is
-- most of what a limit costs Redis. A script runs alone, so no one else changes a key in
-- between; write_states writes what changed when the call's batches are decided. The tables
-- are kept for the next call (see prelude.lua).
local states_by_key, states, nstates = {}, {}, 0

-- begin_call forgets the states of the call before.
local function begin_call()
  states_by_key, nstates = {}, 0
end

-- parse_head reads a batch's head: n, nk, now (nil for Redis TIME), ttl, fp.
local function parse_head(head)
  local n = number(head)
  if n then return n, n, nil, 0, '' end
  local nk, now, ttl, fp
  n, nk, now, ttl, fp = string.match(head, '^(%d+),(%d+),(%-?%d*),(%d+),(%x*)$')
  if not n then error('sluice: bad batch head ' .. head) end
  if now == '' then now = nil else now = tonumber(now) end
  return tonumber(n), tonumber(nk), now, tonumber(ttl), fp
end

-- The idle time (µs) of the last state written, and the string of its expiry (ms): the keys
-- of a window algorithm all expire at the window's end, so most writes reuse the string rather
-- than compute and format it.
local last_idle, last_expire_str = nil, nil
local function expire_string(idle)
  if idle ~= last_idle then last_idle, last_expire_str = idle, fmt(ceil_div(idle, 1000)) end
  return last_expire_str
end

-- The reply table, kept between calls (see prelude.lua): a call's hundred values made a fresh
-- one grow seven times. Every writer fills it from 1 up without a gap, so #reply is where the
-- last call's values end; end_reply drops those past o, the values of this call.
local reply = {}
local function end_reply(o)
  for j = #reply, o + 1, -1 do reply[j] = nil end
  return reply
end

-- undo_ops undoes the commits of the first n ops of the batch, last first, counters' too when
-- counters is true.
local function undo_ops(n, counters)
  for i = n, 1, -1 do
    local u = (i - 1) * UNDO_WIDTH
    if undo[u + 1] and (counters or op_p[i].mode ~= MODE_COUNTER) then
      local s, len, last = op_s[i], undo[u + 4], undo[u + 5]
      s.t, s.v, s.w = undo[u + 1], undo[u + 2], undo[u + 3]
      for j = #s.log, len + 1, -1 do s.log[j] = nil end
      if last then s.log[len][2] = last end
      s.last_changed, s.dirty, s.idle = undo[u + 6], undo[u + 7], undo[u + 8]
      s.braw, s.bn, s.bsum, s.bexp = undo[u + 9], undo[u + 10], undo[u + 11], undo[u + 12]
      s.blast = undo[u + 13]
    end
  end
end

-- drain_state is algorithm.Drain: it empties what is left of p's limit in s, which decide
-- brought up to now and found denied, and returns when s is as good as fresh.
local function drain_state(p, s, now)
  local kind = p.kind
  if kind == TOKEN_BUCKET then
    s.v = 0
    return (s.t + ceil_div(p.capacity, imax(p.rate, 1))) * p.tick
  elseif kind == GCRA then
    if p.rate == 0 then return now end
    local now_t = ticks(p, now)
    s.t, s.v = now_t + idiv(p.capacity, p.rate), imod(p.capacity, p.rate)
    return (s.t + 1) * p.tick
  elseif kind == LEAKY_BUCKET then
    s.v = p.capacity
    return (s.t + ceil_div(s.v, imax(p.rate, 1))) * p.tick
  elseif kind == FIXED_WINDOW or kind == SLIDING_WINDOW_LOG then
    local left = p.limit - s.v
    if left > 0 then return p.commit(p, s, now, left) end
    if kind == FIXED_WINDOW then
      if p.bounds then
        local _, stop = calendar_window(p, now)
        return stop
      end
      return s.t + p.period
    end
    if #s.log >= s.head then return s.log[#s.log][1] + p.period end
  end
  return now
end

-- rollback undoes what the batch that just failed had committed, so that the call's states,
-- written at its end, hold none of it: a failed batch consumes nothing.
local function rollback()
  undo_ops(op_done, true)
end

-- batch_at decides the batch whose KEYS start after ko and ARGV (its ops) after ao, with the
-- head's values, and appends its reply to out, which holds o values; it returns the new count.
-- multi.lua packs several batches in one call. It writes nothing but the idempotency record:
-- write_states writes the states once the call's batches are decided.
local function batch_at(KEYS, ARGV, ko, ao, n, nk, now, ttl, fp, out, o)
  op_done = 0
  -- The record is "expires_at_µs|fingerprint|v,v,...", written only for an allowed batch. Its
  -- expiry is checked against the script's clock, not only left to PX, so that a test clock
  -- governs it as it governs the limits.
  local idem_key = nil
  if ttl > 0 then
    idem_key = KEYS[ko + nk]
    local rec = redis.call('GET', idem_key)
    if rec then
      local expires, rec_fp, vals = string.match(rec, '^(%d+)|(%x+)|(.*)$')
      if expires and tonumber(expires) > now then
        if rec_fp ~= fp then
          out[o + 1], out[o + 2] = MISMATCH, now
          return o + 2
        end
        out[o + 1], out[o + 2] = REPLAYED, now
        o = o + 2
        for x in string.gmatch(vals, '[^,]+') do
          o = o + 1
          out[o] = tonumber(x)
        end
        return o
      end
    end
  end

  -- What each commit changed, for a sibling's denial (or a failure) to undo: UNDO_WIDTH
  -- values per op in one flat array (t, v, w, log length, last entry's cost or false,
  -- last_changed, dirty, idle, and a counter's buckets: text, number, sum, tick exponent,
  -- newest), or false first when the op has none. A lone op has no sibling to deny it, and
  -- nothing after its commit can fail but the record's write.
  local denied, k, keep = false, ko, n > 1 or ttl > 0
  for i = 1, n do
    local str = ARGV[ao + i]
    -- A concurrency op of a reservation names its lease's slot (see parse_op_slot); such a
    -- string is never cached, so a cached op names none.
    local p, slot_id, slot_ttl = op_cache[str], nil, 0
    if not p then p, slot_id, slot_ttl = parse_op_slot(str) end
    local key = KEYS[k + 1]
    local s = states_by_key[key]
    if not s then
      nstates = nstates + 1
      s = states[nstates]
      if not s then
        s = {}
        states[nstates] = s
      end
      load_state(key, KEYS[k + 2], p.kind, s, p, now)
      states_by_key[key] = s
    elseif p.kind == SLIDING_WINDOW_LOG and s.log == NO_LOG then
      s.log = {} -- a log op on a key another kind loaded: NO_LOG stays empty
    end
    k = k + p.nkeys
    local r = op_r[i]
    if not r then
      r = {}
      op_r[i] = r
    end
    local cost, u = p.cost, (i - 1) * UNDO_WIDTH
    p.decide(p, s, now, cost, r)
    op_p[i], op_s[i], undo[u + 1] = p, s, false
    if not r.allowed then
      if p.mode == MODE_BINDING then denied = true end
    elseif cost > 0 and (slot_id or p.kind ~= CONCURRENCY) then
      if keep then
        local last = false
        if #s.log >= s.head then last = s.log[#s.log][2] end
        undo[u + 1], undo[u + 2], undo[u + 3], undo[u + 4] = s.t, s.v, s.w, #s.log
        undo[u + 5], undo[u + 6], undo[u + 7], undo[u + 8] = last, s.last_changed, s.dirty, s.idle
        -- A counter's buckets: a commit may drop, rewrite and merge them.
        undo[u + 9], undo[u + 10], undo[u + 11], undo[u + 12] = s.braw, s.bn, s.bsum, s.bexp
        undo[u + 13] = s.blast
      end
      -- The state's expiry moves on at once: an undo restores it with the rest.
      local idle = p.commit(p, s, now, cost, slot_id, slot_ttl)
      op_idle[i] = idle
      if idle > s.idle then s.idle = idle end
      s.dirty = true
    end
    op_done = i
  end

  if denied then
    -- A counter counts whatever its siblings decide: its commit stands.
    undo_ops(n, false)
    -- Allowed ops of a denied batch consumed nothing: report what they really have left.
    -- Counters did consume, and their states stay dirty: they are written below, expiring as
    -- late as their commits asked, which an undo of a sibling on their key may have undone.
    for i = 1, n do
      local p, r = op_p[i], op_r[i]
      if r.allowed and p.cost > 0 then
        if p.mode ~= MODE_COUNTER then
          p.decide(p, op_s[i], now, 0, look)
          r.remaining, r.reset, r.delay = look.remaining, look.reset, 0
        else
          local s = op_s[i]
          s.idle = imax(s.idle, op_idle[i])
        end
      end
    end
    -- on_deny: drain, once the commits are undone, so that the drain stands: a binding op
    -- that denied a request waiting could admit empties what is left of its limit and
    -- reports the drained state (as store/memory's drain).
    for i = 1, n do
      local p, r = op_p[i], op_r[i]
      if p.drains and not r.allowed and r.reason == REASON_NONE then
        local s = op_s[i]
        s.idle = imax(s.idle, drain_state(p, s, now))
        s.dirty = true
        p.decide(p, s, now, p.cost, r)
      end
    end
  end
  local o0 = o
  out[o + 1], out[o + 2] = DECIDED, now
  o = o + 2
  for i = 1, n do
    local r = op_r[i]
    local code, retry, delay = 8 * r.reason, r.retry, r.delay
    if r.allowed then code = code + 1 end
    if retry ~= 0 then code = code + 2 end
    if delay ~= 0 then code = code + 4 end
    out[o + 1], out[o + 2], out[o + 3] = code, r.remaining, r.reset
    o = o + 3
    if retry ~= 0 then
      o = o + 1
      out[o] = retry
    end
    if delay ~= 0 then
      o = o + 1
      out[o] = delay
    end
  end
  -- A denial is not remembered: its retry, after Retry-After, is decided afresh.
  if ttl > 0 and not denied then
    local rec = {}
    for j = o0 + 3, o do rec[#rec + 1] = fmt(out[j]) end
    redis.call('SET', idem_key, fmt(now + ttl * 1000) .. '|' .. fp .. '|' .. table.concat(rec, ','), 'PX', ttl)
  end
  return o
end

-- write_states writes each state the call changed, once. Keys expire when the state is as
-- good as fresh: at the latest time any of the call's commits asked for.
local function write_states()
  for i = 1, nstates do
    local s = states[i]
    if s.dirty and s.kind == CONCURRENCY then
      write_slots(s)
    elseif s.dirty then
      local expire_ms = expire_string(s.idle)
      save_state(s, expire_ms)
      if s.kind == SLIDING_WINDOW_LOG then
        if s.head > 1 then redis.call('LTRIM', s.log_key, s.head - 1, -1) end
        if s.last_changed then
          local e = s.log[s.loaded]
          redis.call('LSET', s.log_key, s.loaded - s.head, fmt(e[1]) .. ':' .. fmt(e[2]))
        end
        for j = imax(s.loaded + 1, s.head), #s.log do
          redis.call('RPUSH', s.log_key, fmt(s.log[j][1]) .. ':' .. fmt(s.log[j][2]))
        end
        redis.call('PEXPIREAT', s.log_key, expire_ms)
      end
    end
  end
  -- Drop the keys and logs the states hold, so that the tables kept for the next call keep
  -- nothing alive.
  for i = 1, nstates do
    local s = states[i]
    s.key, s.log_key, s.log = nil, nil, NO_LOG
  end
  states_by_key, nstates = {}, 0
end

-- redis_time reads Redis TIME in µs, once per call however many batches use it.
local function redis_time()
  local now = nil
  return function()
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    return now
  end
end

local function batch(KEYS, ARGV)
  bind_globals()
  begin_call()
  local n, nk, now, ttl, fp = parse_head(ARGV[1])
  if not now then now = redis_time()() end
  local o = batch_at(KEYS, ARGV, 0, 1, n, nk, now, ttl, fp, reply, 0)
  write_states()
  return end_reply(o)
end
