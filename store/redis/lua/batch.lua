-- batch.lua: decides a batch of limits at one instant and consumes all of them only if every
-- non-shadow limit allows (docs/architecture.md, Store batch: a denied request consumes nothing), as store/memory does.
-- It follows prelude.lua and the six algorithm files, in one script or one Redis Function
-- library, and defines batch(KEYS, ARGV).
--
-- KEYS: for op i, KEYS[2i-1] = its state ("t:v:w") and KEYS[2i] = its log list
--       (sliding_window_log only); then, when ARGV[2] > 0, the idempotency record.
-- ARGV: [1] now in µs, or '' to read Redis TIME (the default, so Sluice nodes' clocks do not
--       matter); [2] idempotency TTL in ms, 0 for none; [3] n, the number of ops; then 3 values
--       per op: its parameters (see parse_params), its cost, its mode (0 binding, 1 shadow,
--       2 counter: never denies, and keeps what it allowed whatever the others decide); then,
--       when ARGV[2] > 0, the request's fingerprint (hex).
-- Reply: {replayed, now, then per op: allowed (0/1), reason, remaining, reset, retry, delay}.
--        replayed is 0 (decided now), 1 (the record's answer) or 2 (the record holds another
--        fingerprint: the key was reused for another request; nothing decided, no op values).

-- UNDO_WIDTH is how many values an op's undo record holds (see batch).
local UNDO_WIDTH = 6

-- batch_at decides the batch whose KEYS start after ko and ARGV after ao (multi.lua packs
-- several batches in one call); clock is the call's Redis TIME in µs, read once per call, used
-- when the batch's ARGV[1] is ''.
local function batch_at(KEYS, ARGV, ko, ao, clock)
  local now
  if ARGV[ao + 1] ~= '' then
    now = tonumber(ARGV[ao + 1])
  else
    now = clock()
  end
  local ttl = tonumber(ARGV[ao + 2])
  local n = tonumber(ARGV[ao + 3])
  local idem_key = KEYS[ko + 2 * n + 1]

  -- The record is "expires_at_µs|fingerprint|v,v,...", written only for an allowed batch. Its
  -- expiry is checked against the script's clock, not only left to PX, so that a test clock
  -- governs it as it governs the limits.
  local fp = nil
  if ttl > 0 then
    fp = ARGV[ao + 3 * n + 4]
    local rec = redis.call('GET', idem_key)
    if rec then
      local expires, rec_fp, vals = string.match(rec, '^(%d+)|(%x+)|(.*)$')
      if expires and tonumber(expires) > now then
        if rec_fp ~= fp then return { 2, now } end
        local out = { 1, now }
        for x in string.gmatch(vals, '[^,]+') do out[#out + 1] = tonumber(x) end
        return out
      end
    end
  end

  -- Ops on one key share one state, so a later op sees an earlier op's commit. Per op, values
  -- go in arrays rather than in a table of their own: creating tables is most of a call's cost.
  local states, params, st, costs, idles, results, counters = {}, {}, {}, {}, {}, {}, {}
  -- What each commit changed, for a sibling's denial to undo: UNDO_WIDTH values per op in one
  -- flat array (t, v, w, log length, last entry's cost or false, last_changed). A lone op has
  -- no sibling to deny it, so it never undoes.
  local undo = nil
  if n > 1 then undo = {} end
  local denied = false
  for i = 1, n do
    local b = ao + 3 + (i - 1) * 3
    local p = parse_params(ARGV[b + 1])
    local cost = tonumber(ARGV[b + 2])
    local key = KEYS[ko + 2 * i - 1]
    local s = states[key]
    if not s then
      s = load_state(key, KEYS[ko + 2 * i], p.kind)
      states[key] = s
    end
    local alg = algorithms[p.kind]
    local r = alg.decide(p, s, now, cost)
    local mode = ARGV[b + 3]
    params[i], st[i], costs[i], results[i], counters[i] = p, s, cost, r, mode == '2'
    if not r.allowed then
      if mode == '0' then denied = true end
    elseif cost > 0 then
      -- A counter counts whatever its siblings decide: it keeps no undo record.
      if undo and mode ~= '2' then
        local u, last = (i - 1) * UNDO_WIDTH, false
        if #s.log >= s.head then last = s.log[#s.log][2] end
        undo[u + 1], undo[u + 2], undo[u + 3] = s.t, s.v, s.w
        undo[u + 4], undo[u + 5], undo[u + 6] = #s.log, last, s.last_changed or false
      end
      idles[i] = alg.commit(p, s, now, cost)
      s.dirty = true
    end
  end

  if denied then
    for i = n, 1, -1 do
      local u = (i - 1) * UNDO_WIDTH
      if undo and undo[u + 1] then
        local s, len, last = st[i], undo[u + 4], undo[u + 5]
        s.t, s.v, s.w = undo[u + 1], undo[u + 2], undo[u + 3]
        for j = #s.log, len + 1, -1 do s.log[j] = nil end
        if last then s.log[len][2] = last end
        s.last_changed, s.dirty = undo[u + 6], false
      end
    end
    -- Allowed ops of a denied batch consumed nothing: report what they really have left.
    -- Counters did consume, and their states stay dirty: they are written below.
    for i = 1, n do
      if results[i].allowed and costs[i] > 0 and not counters[i] then
        local r = algorithms[params[i].kind].decide(params[i], st[i], now, 0)
        results[i].remaining, results[i].reset, results[i].delay = r.remaining, r.reset, 0
      end
    end
  end
  for i = 1, n do
    if idles[i] and (counters[i] or not denied) then st[i].idle = imax(st[i].idle, idles[i]) end
  end
  -- Write each changed state once (ops on one key share it). Keys expire when the state is
  -- as good as fresh.
  for i = 1, n do
    local s = st[i]
    if s.dirty then
      s.dirty = false
      local expire_ms = fmt(ceil_div(s.idle, 1000))
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

  local out = { 0, now }
  for i = 1, n do
    local r, o = results[i], 2 + (i - 1) * 6
    out[o + 1] = r.allowed and 1 or 0
    out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = r.reason, r.remaining, r.reset, r.retry, r.delay
  end
  -- A denial is not remembered: its retry, after Retry-After, is decided afresh.
  if ttl > 0 and not denied then
    local rec = {}
    for j = 3, #out do rec[#rec + 1] = fmt(out[j]) end
    redis.call('SET', idem_key, fmt(now + ttl * 1000) .. '|' .. fp .. '|' .. table.concat(rec, ','), 'PX', ttl)
  end
  return out
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
  bind_math()
  return batch_at(KEYS, ARGV, 0, 0, redis_time())
end
