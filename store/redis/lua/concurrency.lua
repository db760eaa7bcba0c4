-- concurrency.lua: the twin of algorithm's concurrency limit (algorithm/concurrency.go): at most
-- limit leases in flight per key, nothing refilling with time. The slots live in a sorted set,
-- the op's second key (its log key), lease ids scored by expiry (µs); a slot counts while
-- now < expiry. The state key is not used.
-- State: v = slots in the set at now (expired ones removed when first read), t and w = the
-- first and last expiry among them (0 when none); log = the slots this call took, {expiry,
-- id}, written by write_states with ZADD. An undo truncates log as it does a sliding log's.

-- MAX_SLOT_TTL keeps an expiry exact in a double (the Limiter sends at most an hour).
local MAX_SLOT_TTL = 2 ^ 50

-- read_slots reads the set once per call: drops the expired slots and keeps the count and
-- the first and last expiry.
local function read_slots(s, now)
  if s.zread then return end
  s.zread = true
  redis.call('ZREMRANGEBYSCORE', s.log_key, '-inf', now)
  s.v, s.t, s.w = redis.call('ZCARD', s.log_key), 0, 0
  if s.v > 0 then
    s.t = tonumber(redis.call('ZRANGE', s.log_key, 0, 0, 'WITHSCORES')[2])
    s.w = tonumber(redis.call('ZRANGE', s.log_key, -1, -1, 'WITHSCORES')[2])
  end
  if s.log == NO_LOG then s.log = {} end
end

algorithms[CONCURRENCY] = {
  decide = function(p, s, now, cost, r)
    read_slots(s, now)
    clear_result(r)
    local n, first, last = s.v, s.t, s.w
    if n == 0 then first = 0 end
    -- Slots this call took for earlier batches count as the set's.
    for j = s.head, #s.log do
      local exp = s.log[j][1]
      if exp > now then
        n = n + 1
        if first == 0 or exp < first then first = exp end
        if exp > last then last = exp end
      end
    end
    if cost == 0 then
      r.allowed = true
    elseif p.limit == 0 then
      r.reason = REASON_COST_EXCEEDS_CAPACITY
    elseif n < p.limit then
      r.allowed = true
      n = n + 1
    end
    r.remaining = imax(0, p.limit - n)
    if last > now then
      r.reset = imin(last - now, MAX_SLOT_WAIT)
      if not r.allowed and r.reason == REASON_NONE then r.retry = imin(first - now, MAX_SLOT_WAIT) end
    end
    return r
  end,
  -- commit takes a slot for lease id until now+ttl; batch.lua calls it only for an op that
  -- names a lease (a check without one only asks).
  commit = function(p, s, now, cost, id, ttl)
    local exp = now + imin(imax(ttl, 0), MAX_SLOT_TTL)
    s.log[#s.log + 1] = { exp, id }
    return imax(exp, s.w)
  end,
}

-- write_slots adds the slots this call took and keeps the set until its last expiry.
local function write_slots(s)
  local last = s.w
  for j = s.head, #s.log do
    local e = s.log[j]
    redis.call('ZADD', s.log_key, e[1], e[2])
    if e[1] > last then last = e[1] end
  end
  if last > 0 then redis.call('PEXPIREAT', s.log_key, ceil_div(last, 1000)) end
end

-- settle_slot renews (ttl > 0) or frees lease id's slot in the set at key at now, as
-- algorithm.SettleSlot; it reports whether id held one.
local function settle_slot(key, now, id, ttl)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if not redis.call('ZSCORE', key, id) then return false end
  if ttl > 0 then
    redis.call('ZADD', key, 'XX', now + imin(ttl, MAX_SLOT_TTL), id)
    local last = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    redis.call('PEXPIREAT', key, ceil_div(last, 1000))
  else
    redis.call('ZREM', key, id)
  end
  return true
end
