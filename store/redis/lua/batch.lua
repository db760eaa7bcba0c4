-- batch.lua: decides a batch of limits at one instant and consumes all of them only if every
-- non-shadow limit allows (DESIGN.md: a denied request consumes nothing), as store/memory does.
-- It follows prelude.lua and the six algorithm files, in one script or one Redis Function
-- library, and defines batch(KEYS, ARGV).
--
-- KEYS: for op i, KEYS[2i-1] = its state ("t:v:w") and KEYS[2i] = its log list
--       (sliding_window_log only); then, when ARGV[2] > 0, the idempotency record.
-- ARGV: [1] now in µs, or '' to read Redis TIME (the default, so Sluice nodes' clocks do not
--       matter); [2] idempotency TTL in ms, 0 for none; [3] n, the number of ops; then 3 values
--       per op: its parameters (see parse_params), its cost, shadow (0/1).
-- Reply: {replayed (0/1), now, then per op: allowed (0/1), reason, remaining, reset, retry, delay}.

local function batch(KEYS, ARGV)

  local now
  if ARGV[1] ~= '' then
    now = tonumber(ARGV[1])
  else
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local ttl = tonumber(ARGV[2])
  local n = tonumber(ARGV[3])
  local idem_key = KEYS[2 * n + 1]

  -- The record is "expires_at_µs|v,v,...": its expiry is checked against the script's clock,
  -- not only left to PX, so that a test clock governs it as it governs the limits.
  if ttl > 0 then
    local rec = redis.call('GET', idem_key)
    if rec then
      local bar = string.find(rec, '|', 1, true)
      if bar and tonumber(string.sub(rec, 1, bar - 1)) > now then
        local out = { 1, now }
        for x in string.gmatch(string.sub(rec, bar + 1), '[^,]+') do out[#out + 1] = tonumber(x) end
        return out
      end
    end
  end

  -- Ops on one key share one state, so a later op sees an earlier op's commit.
  local states = {}
  local function load(i, kind)
    local key = KEYS[2 * i - 1]
    if not states[key] then states[key] = load_state(key, KEYS[2 * i], kind) end
    return states[key]
  end

  local ops, results, undo = {}, {}, {}
  local denied = false
  for i = 1, n do
    local b = 3 + (i - 1) * 3
    local p = parse_params(ARGV[b + 1])
    local cost, shadow = tonumber(ARGV[b + 2]), ARGV[b + 3] == '1'
    local s = load(i, p.kind)
    local alg = algorithms[p.kind]
    local r = alg.decide(p, s, now, cost)
    results[i] = r
    ops[i] = { p = p, s = s, cost = cost }
    if not r.allowed then
      if not shadow then denied = true end
    elseif cost > 0 then
      local last = nil
      if #s.log >= s.head then last = s.log[#s.log][2] end
      undo[i] = { t = s.t, v = s.v, w = s.w, n = #s.log, last = last, last_changed = s.last_changed }
      ops[i].idle = alg.commit(p, s, now, cost)
      s.dirty = true
    end
  end

  if denied then
    for i = n, 1, -1 do
      local u = undo[i]
      if u then
        local s = ops[i].s
        s.t, s.v, s.w = u.t, u.v, u.w
        for j = #s.log, u.n + 1, -1 do s.log[j] = nil end
        if u.last then s.log[u.n][2] = u.last end
        s.last_changed, s.dirty = u.last_changed, false
      end
    end
    -- Allowed ops of a denied batch consumed nothing: report what they really have left.
    for i = 1, n do
      if results[i].allowed and ops[i].cost > 0 then
        local r = algorithms[ops[i].p.kind].decide(ops[i].p, ops[i].s, now, 0)
        results[i].remaining, results[i].reset, results[i].delay = r.remaining, r.reset, 0
      end
    end
  else
    for i = 1, n do
      if ops[i].idle then ops[i].s.idle = imax(ops[i].s.idle, ops[i].idle) end
    end
    -- Write each changed state once. Keys expire when the state is as good as fresh.
    for _, s in pairs(states) do
      if s.dirty then
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
  end

  local out = { 0, now }
  for i = 1, n do
    local r = results[i]
    local allowed = 0
    if r.allowed then allowed = 1 end
    out[#out + 1] = allowed
    out[#out + 1] = r.reason
    out[#out + 1] = r.remaining
    out[#out + 1] = r.reset
    out[#out + 1] = r.retry
    out[#out + 1] = r.delay
  end
  if ttl > 0 then
    local rec = {}
    for j = 3, #out do rec[#rec + 1] = fmt(out[j]) end
    redis.call('SET', idem_key, fmt(now + ttl * 1000) .. '|' .. table.concat(rec, ','), 'PX', ttl)
  end
  return out
end
