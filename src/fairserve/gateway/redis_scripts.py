"""The atomic parts of the shared state across gateway replicas, as Lua scripts Redis runs in one step each
(`shared_state.py` calls them; the key layout is described there)."""

# One round trip per sync. ARGV: prefix, replica, ttl_ms, hold_ms, now_ms, epoch, since, batch, reset(0/1), then
# counted sections:
#   (now_ms: the time expiries are measured in; "" for Redis's own clock, a test's clock otherwise)
#   (epoch, since: what this replica last read, as the data's epoch (set when Redis starts it) and its change number:
#    the answer carries only the tenants changed since then; all of them when the epoch differs. A replica that had
#    an epoch and finds none, finds that Redis lost its data: for hold_ms no lease grows beyond what its replica has
#    in flight, so that every replica can report its requests in flight before capacity is handed out again)
#   (batch: "TOKEN:N", this replica's number for the charges, weights and reset it carries. They are applied only if
#    N is above the number last applied for TOKEN (`P:sn`): a sync whose answer was lost is sent again with the same
#    batch, and Redis, which may have run it, never charges twice)
#   charges: n, then n x (tenant, service delta, counter delta, lift or "", base counter, base service)
#   weights set: n, then n x (tenant, weight);  weights seeded (only if unset): n, then n x (tenant, weight)
#   backlogged here: n, then n x tenant
#   starved: the tenant at the head of this replica's queue when it may be admitted but no lease has room, else ""
#   backends: n, then n x (url, limit r, limit t or 0, in use r, in use t, need r, need t, spare r, spare t,
#                          keep r, keep t)
#     (need = in use + the queued demand this replica may admit now; spare = headroom beyond it, granted only
#      from capacity no other replica is waiting for; keep = the limit the replica admits within while this sync is
#      in flight: the new lease is never below it, or below its old lease, whichever is smaller; a replica told that
#      others wait leaves its spare out of keep, so that the spare is released at its next sync)
# Returns {changed tenants (flat: tenant, counter, service, weight; "" where unset), tenants backlogged elsewhere,
#          leases (r, others waiting r (0/1), t, others waiting t per backend), live replicas, epoch, change number,
#          starved elsewhere (flat: tenant, counter, for each other live replica that reported itself starved)}.
# Every change to a tenant's counter, service or weight gives it the sync's change number in P:v (P:seq counts them).
SYNC_LUA = """
local p, rid, ttl, hold_ms = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local epoch, since, batch, reset = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local t = redis.call('TIME')
local now = tonumber(ARGV[5]) or (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local i = 9
local current = redis.call('GET', p .. ':e')
if not current then
  current = t[1] .. '.' .. t[2]
  redis.call('SET', p .. ':e', current)
  if epoch ~= '' then redis.call('SET', p .. ':hold', now + hold_ms) end
end
local seq = nil
local function touch(tenant)
  if not seq then seq = redis.call('INCR', p .. ':seq') end
  redis.call('ZADD', p .. ':v', seq, tenant)
end
local function nxt() i = i + 1; return ARGV[i] end
local fmt = '%.17g'
-- the batch: applied once (a retried sync carries the same one)
local colon = string.find(batch, ':', 1, true)
local token, number = string.sub(batch, 1, colon - 1), tonumber(string.sub(batch, colon + 1))
local fresh = number > tonumber(redis.call('HGET', p .. ':sn', token) or '-1')
if fresh then redis.call('HSET', p .. ':sn', token, number) end
redis.call('ZADD', p .. ':seen', now, token)
for _, old in ipairs(redis.call('ZRANGEBYSCORE', p .. ':seen', '-inf', now - 3600000)) do
  redis.call('HDEL', p .. ':sn', old)
  redis.call('ZREM', p .. ':seen', old)
end
redis.call('ZREMRANGEBYSCORE', p .. ':r', '-inf', now)
local hold = tonumber(redis.call('GET', p .. ':hold') or '-1') > now
redis.call('ZADD', p .. ':r', now + ttl, rid)
if fresh and reset == '1' then
  local all = redis.call('HKEYS', p .. ':c')
  for _, tenant in ipairs(all) do
    redis.call('HSET', p .. ':c', tenant, '0')
    touch(tenant)
  end
end
for _ = 1, tonumber(nxt()) do
  local tenant, ds, dc, lift, bc, bs = nxt(), tonumber(nxt()), tonumber(nxt()), nxt(), tonumber(nxt()), tonumber(nxt())
  if fresh then
    local c = tonumber(redis.call('HGET', p .. ':c', tenant) or bc)
    local s = tonumber(redis.call('HGET', p .. ':s', tenant) or bs)
    if lift ~= '' then c = math.max(c, tonumber(lift)) end
    redis.call('HSET', p .. ':c', tenant, string.format(fmt, c + dc))
    redis.call('HSET', p .. ':s', tenant, string.format(fmt, s + ds))
    touch(tenant)
  end
end
for _ = 1, tonumber(nxt()) do
  local tenant, w = nxt(), nxt()
  if fresh then
    redis.call('HSET', p .. ':w', tenant, w)
    touch(tenant)
  end
end
for _ = 1, tonumber(nxt()) do
  local tenant = nxt()
  if redis.call('HSETNX', p .. ':w', tenant, nxt()) == 1 then touch(tenant) end
end
local mine = {}
for _ = 1, tonumber(nxt()) do
  local tenant = nxt()
  mine[tenant] = true
  redis.call('ZADD', p .. ':b', now + ttl, tenant .. '\\n' .. rid)
end
redis.call('ZREMRANGEBYSCORE', p .. ':b', '-inf', now)
local elsewhere, seen = {}, {}
for _, m in ipairs(redis.call('ZRANGE', p .. ':b', 0, -1)) do
  local nl = string.find(m, '\\n', 1, true)
  local tenant, owner = string.sub(m, 1, nl - 1), string.sub(m, nl + 1)
  if owner == rid then
    if not mine[tenant] then redis.call('ZREM', p .. ':b', m) end
  elseif not seen[tenant] then
    seen[tenant] = true
    table.insert(elsewhere, tenant)
  end
end
local starved = nxt()
if starved ~= '' then redis.call('HSET', p .. ':st', rid, starved) else redis.call('HDEL', p .. ':st', rid) end
local live = {}
local replicas = redis.call('ZRANGE', p .. ':r', 0, -1)
for _, r in ipairs(replicas) do live[r] = true end
local waiting = {}
local st = redis.call('HGETALL', p .. ':st')
for j = 1, #st, 2 do
  if not live[st[j]] then
    redis.call('HDEL', p .. ':st', st[j])
  elseif st[j] ~= rid then
    table.insert(waiting, st[j + 1])
    table.insert(waiting, redis.call('HGET', p .. ':c', st[j + 1]) or '0')
  end
end
local function others(key, need_key)
  -- the leases of the other live replicas, and their demand the leases do not cover; forgets dead replicas
  local held, unmet, all, needs = 0, 0, redis.call('HGETALL', key), {}
  local nall = redis.call('HGETALL', need_key)
  for j = 1, #nall, 2 do needs[nall[j]] = tonumber(nall[j + 1]) end
  for j = 1, #all, 2 do
    local r = all[j]
    if r ~= rid then
      if live[r] then
        local g = tonumber(all[j + 1])
        held = held + g
        unmet = unmet + math.max(0, (needs[r] or 0) - g)
      else
        redis.call('HDEL', key, r)
        redis.call('HDEL', need_key, r)
      end
    end
  end
  return held, unmet
end
local leases = {}
local function lease(suffix, url, limit, used, need, spare, keep)
  -- at least what is in flight and what the replica may admit before it reads this answer (never more than the
  -- lease it already had); the demand as far as the others' leases leave room; the spare only from what nobody
  -- else is waiting for
  local key, need_key = p .. ':g' .. suffix .. ':' .. url, p .. ':n' .. suffix .. ':' .. url
  local old = tonumber(redis.call('HGET', key, rid) or '0')
  local held, unmet = others(key, need_key)
  local g = used
  if not hold then
    g = math.max(used, math.min(need, limit - held))
    g = g + math.max(0, math.min(spare, limit - held - unmet - g))
  end
  g = math.max(g, math.min(keep, old))
  redis.call('HSET', key, rid, g)
  redis.call('HSET', need_key, rid, need)
  table.insert(leases, g)
  table.insert(leases, unmet > 0 and 1 or 0)
end
for _ = 1, tonumber(nxt()) do
  local url, lr, lt, ur, ut, nr, nt, sr, st, kr, kt = nxt(), tonumber(nxt()), tonumber(nxt()), tonumber(nxt()),
    tonumber(nxt()), tonumber(nxt()), tonumber(nxt()), tonumber(nxt()), tonumber(nxt()), tonumber(nxt()),
    tonumber(nxt())
  lease('r', url, lr, ur, nr, sr, kr)
  if lt > 0 then lease('t', url, lt, ut, nt, st, kt) else table.insert(leases, 0); table.insert(leases, 0) end
end
local tenants
if current == epoch then
  tenants = redis.call('ZRANGEBYSCORE', p .. ':v', '(' .. since, '+inf')
else
  tenants = redis.call('ZRANGE', p .. ':v', 0, -1)
end
local changed = {}
for _, tenant in ipairs(tenants) do
  table.insert(changed, tenant)
  table.insert(changed, redis.call('HGET', p .. ':c', tenant) or '')
  table.insert(changed, redis.call('HGET', p .. ':s', tenant) or '')
  table.insert(changed, redis.call('HGET', p .. ':w', tenant) or '')
end
return {changed, elsewhere, leases, #replicas, current, redis.call('GET', p .. ':seq') or '0', waiting}
"""

# Leaving: this replica's leases and backlog stop counting at once. ARGV: prefix, replica, batch token, backend URLs...
LEAVE_LUA = """
local p, rid, token = ARGV[1], ARGV[2], ARGV[3]
redis.call('ZREM', p .. ':r', rid)
redis.call('HDEL', p .. ':st', rid)
redis.call('HDEL', p .. ':sn', token)
redis.call('ZREM', p .. ':seen', token)
for _, m in ipairs(redis.call('ZRANGE', p .. ':b', 0, -1)) do
  if string.sub(m, -(#rid + 1)) == '\\n' .. rid then redis.call('ZREM', p .. ':b', m) end
end
for k = 4, #ARGV do
  for _, h in ipairs({':gr:', ':gt:', ':nr:', ':nt:'}) do redis.call('HDEL', p .. h .. ARGV[k], rid) end
end
return 1
"""
