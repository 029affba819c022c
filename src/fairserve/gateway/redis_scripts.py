"""The atomic parts of the shared state across gateway replicas, as Lua scripts Redis runs in one step each
(`shared_state.py` calls them), and `sync_args`, the one place that lays out a sync's arguments.

Every replica pointing at the same Redis URL and key prefix `P` shares:
- each tenant's virtual counter, service and weight (hash `P:t`, fields `c:TENANT`, `s:TENANT`, `w:TENANT`);
- which tenants are backlogged on which live replica (a set per replica, `P:bk:REPLICA`; `P:bn`, how many live
  replicas backlog each tenant) and, for the lift, the tenants backlogged anywhere scored by counter (sorted set
  `P:f:`, read in O(log n)): a dead replica's backlog is gone within `ttl_s`;
- the replicas alive (sorted set `P:r`, scored by expiry) and each replica's capacity lease on each backend
  (hashes `P:gr:URL` requests, `P:gt:URL` tokens; `P:nr:URL`, `P:nt:URL` what each replica needs now): the leases
  of all live replicas never add up to more than the backend's `max_inflight_requests` / `max_inflight_tokens`, and
  a dead replica's lease stops counting after `ttl_s`; the replicas waiting for capacity (`P:st`, their heads);
- the data's epoch `P:e` (set when the first sync finds none) and change numbers (`P:seq`; sorted set `P:v`, each
  tenant scored by the number of its last change; `P:wseq`, `P:wv` the same for weights set by an admin), and the
  generation of counter resets `P:rg`;
- `P:sn`, the number of the last batch applied for each replica's token (`P:seen`: when each was last seen, so that
  the numbers of replicas gone for an hour are forgotten);
- `P:hold`, set for `hold_s` when a replica that had an epoch finds none (Redis lost its data): meanwhile no lease
  grows beyond what its replica has in flight, and each replica writes back the tenants it knows.

A sync costs what changed: every step below touches the tenants this replica charged, lifted, or whose backlog it
changed, the replicas (a few per backend), and at most `pull` tenants changed elsewhere. Nothing walks all tenants
except a counter reset and the first sync of a replica (or of a Redis that lost its data), which reads them all."""

from typing import Any

# One round trip per sync. ARGV: prefix, replica, ttl_ms, hold_ms, now_ms, epoch, since, weights since, pull, batch,
# reset (0/1), backlog mode ("+" changes, "=" the whole list), then counted sections:
#   (now_ms: the time expiries are measured in; "" for Redis's own clock, a test's clock otherwise)
#   (epoch, since, weights since: what this replica last read, as the data's epoch (set when Redis starts it) and
#    two change numbers (`P:seq` counts every change to a tenant's counter, service or weight, `P:wseq` the weights
#    set by an admin). The answer carries the tenants changed since `since`, at most `pull` of them, the oldest
#    changes first, and every weight set since `weights since`; all tenants when the epoch differs. A replica that
#    had an epoch and finds none, finds that Redis lost its data: for hold_ms no lease grows beyond what its
#    replica has in flight, so that every replica can report its requests in flight before capacity is handed out
#    again)
#   (batch: "TOKEN:N", this replica's number for the charges, weights and reset it carries. They are applied only if
#    N is above the number last applied for TOKEN (`P:sn`): a sync whose answer was lost is sent again with the same
#    batch, and Redis, which may have run it, never charges twice)
#   charges: n, then n x (tenant, service delta, counter delta, lift or "", base counter, base service)
#   weights set: n, then n x (tenant, weight);  weights seeded (only if unset): n, then n x (tenant, weight)
#   backlog: n tenants now backlogged here (mode "=": all of them), then n tenants no longer backlogged here
#   starved: the tenant at the head of this replica's queue when it may be admitted but no lease has room, else ""
#   backends: n, then n x (url, limit r, limit t or 0, in use r, in use t, need r, need t, spare r, spare t,
#                          keep r, keep t)
#     (need = in use + the queued demand this replica may admit now; spare = headroom beyond it, granted only
#      from capacity no other replica is waiting for; keep = the limit the replica admits within while this sync is
#      in flight: the new lease is never below it, or below its old lease, whichever is smaller; a replica told that
#      others wait leaves its spare out of keep, so that the spare is released at its next sync)
# Returns {tenants (flat: tenant, counter, service, weight; "" where unset): those charged or newly backlogged
#          here and those changed since `since`, floor (flat: tenant, counter: the two smallest counters backlogged
#          on any live replica), starved elsewhere (flat: tenant, counter, per other live replica that waits),
#          leases (r, others waiting r (0/1), t, others waiting t per backend), live replicas, epoch, since,
#          weights since, reset generation, known (0: Redis had forgotten this replica, and with it its backlog)}.
# NOTE: the floor lives in one sorted set per parent (`P:f:` + the parent's path, "" at the top), so that groups of
# tenants can join the same structure.

SYNC_LUA = """
local p, rid, ttl, hold_ms = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local epoch, since, wsince, pull = ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9])
local batch, reset, mode = ARGV[10], ARGV[11], ARGV[12]
local t = redis.call('TIME')
local now = tonumber(ARGV[5]) or (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local i = 12
local function nxt() i = i + 1; return ARGV[i] end
-- a tenant's counter, service and weight are the fields c:TENANT, s:TENANT, w:TENANT of one hash
local T, V, WV, SEQ = p .. ':t', p .. ':v', p .. ':wv', p .. ':seq'
local F, BN, ST, R = p .. ':f:', p .. ':bn', p .. ':st', p .. ':r'
local fmt = '%.17g'
local current = redis.call('GET', p .. ':e')
if not current then
  current = t[1] .. '.' .. t[2]
  redis.call('SET', p .. ':e', current)
  if epoch ~= '' then redis.call('SET', p .. ':hold', now + hold_ms) end
end
local function touch(tenant) redis.call('ZADD', V, redis.call('INCR', SEQ), tenant) end
local rows, listed = {}, {}
local function row(tenant)
  if not listed[tenant] then listed[tenant] = true; table.insert(rows, tenant) end
end
-- the backlog: each replica's set `P:bk:REPLICA`, how many live replicas backlog each tenant (`P:bn`), and the
-- tenants backlogged anywhere scored by counter (`P:f:`)
local function backlog(key, tenant)
  if redis.call('SADD', key, tenant) == 1 and redis.call('HINCRBY', BN, tenant, 1) == 1 then
    redis.call('ZADD', F, redis.call('HGET', T, 'c:' .. tenant) or '0', tenant)
  end
end
local function unbacklog(tenant)
  if redis.call('HINCRBY', BN, tenant, -1) <= 0 then
    redis.call('HDEL', BN, tenant)
    redis.call('ZREM', F, tenant)
  end
end
-- replicas: a dead one's backlog and wait stop counting (its leases, below)
local live, replicas, known = {}, 1, 0
local all = redis.call('ZRANGE', R, 0, -1, 'WITHSCORES')
for j = 1, #all, 2 do
  local r = all[j]
  if tonumber(all[j + 1]) > now then
    live[r] = true
    if r == rid then known = 1 else replicas = replicas + 1 end
  else
    local key = p .. ':bk:' .. r
    for _, tenant in ipairs(redis.call('SMEMBERS', key)) do unbacklog(tenant) end
    redis.call('DEL', key)
    redis.call('HDEL', ST, r)
    redis.call('ZREM', R, r)
  end
end
live[rid] = true
redis.call('ZADD', R, now + ttl, rid)
local hold = tonumber(redis.call('GET', p .. ':hold') or '-1') > now
-- the batch: applied once (a retried sync carries the same one)
local colon = string.find(batch, ':', 1, true)
local token, number = string.sub(batch, 1, colon - 1), tonumber(string.sub(batch, colon + 1))
local fresh = number > tonumber(redis.call('HGET', p .. ':sn', token) or '-1')
if fresh then redis.call('HSET', p .. ':sn', token, number) end
if number % 256 == 1 then  -- NOTE: now and then: forget the numbers of replicas gone for an hour
  redis.call('ZADD', p .. ':seen', now, token)
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', p .. ':seen', '-inf', now - 3600000)) do
    redis.call('HDEL', p .. ':sn', old)
    redis.call('ZREM', p .. ':seen', old)
  end
end
if fresh and reset == '1' then
  redis.call('INCR', p .. ':rg')
  for _, field in ipairs(redis.call('HKEYS', T)) do
    if string.sub(field, 1, 2) == 'c:' then redis.call('HSET', T, field, '0') end
  end
  for _, tenant in ipairs(redis.call('ZRANGE', F, 0, -1)) do redis.call('ZADD', F, 0, tenant) end
end
-- the charges, a few commands for all of them (in chunks, as unpack() has a limit); one change number each
local charged = {}
for _ = 1, tonumber(nxt()) do
  table.insert(charged, {nxt(), tonumber(nxt()), tonumber(nxt()), nxt(), tonumber(nxt()), tonumber(nxt())})
end
if fresh and #charged > 0 then
  local k = redis.call('INCRBY', SEQ, #charged) - #charged
  for a = 1, #charged, 500 do
    local b = math.min(a + 499, #charged)
    local fields, set, floor, log = {}, {}, {}, {}
    for j = a, b do
      table.insert(fields, 'c:' .. charged[j][1])
      table.insert(fields, 's:' .. charged[j][1])
    end
    local old = redis.call('HMGET', T, unpack(fields))
    for j = a, b do
      local tenant, ds, dc, lift, bc, bs = unpack(charged[j])
      local q = 2 * (j - a)
      local c, s = tonumber(old[q + 1] or bc), tonumber(old[q + 2] or bs)
      if lift ~= '' then c = math.max(c, tonumber(lift)) end
      local cs = string.format(fmt, c + dc)
      k = k + 1
      for _, x in ipairs({'c:' .. tenant, cs, 's:' .. tenant, string.format(fmt, s + ds)}) do table.insert(set, x) end
      table.insert(floor, cs)
      table.insert(floor, tenant)
      table.insert(log, k)
      table.insert(log, tenant)
    end
    redis.call('HSET', T, unpack(set))
    redis.call('ZADD', F, 'XX', unpack(floor))
    redis.call('ZADD', V, unpack(log))
  end
end
for _, c in ipairs(charged) do row(c[1]) end
for _ = 1, tonumber(nxt()) do
  local tenant, w = nxt(), nxt()
  if fresh then
    redis.call('HSET', T, 'w:' .. tenant, w)
    touch(tenant)
    redis.call('ZADD', WV, redis.call('INCR', p .. ':wseq'), tenant)
  end
  row(tenant)
end
for _ = 1, tonumber(nxt()) do
  local tenant = nxt()
  if redis.call('HSETNX', T, 'w:' .. tenant, nxt()) == 1 then touch(tenant) end
end
local bk = p .. ':bk:' .. rid
if mode == '=' then
  local want = {}
  for _ = 1, tonumber(nxt()) do
    local tenant = nxt()
    want[tenant] = true
    backlog(bk, tenant)
    row(tenant)
  end
  for _, tenant in ipairs(redis.call('SMEMBERS', bk)) do
    if not want[tenant] then
      redis.call('SREM', bk, tenant)
      unbacklog(tenant)
    end
  end
else
  for _ = 1, tonumber(nxt()) do
    local tenant = nxt()
    backlog(bk, tenant)
    row(tenant)
  end
end
for _ = 1, tonumber(nxt()) do
  local tenant = nxt()
  if redis.call('SREM', bk, tenant) == 1 then unbacklog(tenant) end
end
local starved = nxt()
if starved ~= '' then redis.call('HSET', ST, rid, starved) else redis.call('HDEL', ST, rid) end
local waiting, heads = {}, {}
local st = redis.call('HGETALL', ST)
for j = 1, #st, 2 do
  if st[j] ~= rid and live[st[j]] then table.insert(heads, st[j + 1]) end
end
if #heads > 0 then
  local fields = {}
  for _, tenant in ipairs(heads) do table.insert(fields, 'c:' .. tenant) end
  local counters = redis.call('HMGET', T, unpack(fields))
  for j, tenant in ipairs(heads) do
    table.insert(waiting, tenant)
    table.insert(waiting, counters[j] or '0')
  end
end
local function others(key, need_key)
  -- the leases of the other live replicas, and their demand the leases do not cover; forgets dead replicas
  local held, unmet, old, all, needs = 0, 0, 0, redis.call('HGETALL', key), {}
  local nall = redis.call('HGETALL', need_key)
  for j = 1, #nall, 2 do needs[nall[j]] = tonumber(nall[j + 1]) end
  for j = 1, #all, 2 do
    local r = all[j]
    if r == rid then
      old = tonumber(all[j + 1])
    else
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
  return held, unmet, old
end
local leases = {}
local function lease(suffix, url, limit, used, need, spare, keep)
  -- at least what is in flight and what the replica may admit before it reads this answer (never more than the
  -- lease it already had); the demand as far as the others' leases leave room; the spare only from what nobody
  -- else is waiting for
  local key, need_key = p .. ':g' .. suffix .. ':' .. url, p .. ':n' .. suffix .. ':' .. url
  local held, unmet, old = others(key, need_key)
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
-- what changed elsewhere: the oldest changes first, at most `pull` (all tenants for a replica new to this data)
local nsince, nwsince
if current ~= epoch then
  for _, tenant in ipairs(redis.call('ZRANGE', V, 0, -1)) do row(tenant) end
  nsince, nwsince = redis.call('GET', SEQ) or '0', redis.call('GET', p .. ':wseq') or '0'
else
  local got = redis.call('ZRANGEBYSCORE', V, '(' .. since, '+inf', 'WITHSCORES', 'LIMIT', 0, pull)
  for j = 1, #got, 2 do row(got[j]) end
  nsince = #got == 2 * pull and got[#got] or (redis.call('GET', SEQ) or '0')
  local wgot = redis.call('ZRANGEBYSCORE', WV, '(' .. wsince, '+inf', 'WITHSCORES')
  for j = 1, #wgot, 2 do row(wgot[j]) end
  nwsince = #wgot > 0 and wgot[#wgot] or wsince
end
local out = {}
for k = 1, #rows, 1000 do  -- NOTE: in chunks, as unpack() has a limit
  local chunk, fields = {}, {}
  for j = k, math.min(k + 999, #rows) do
    local tenant = rows[j]
    table.insert(chunk, tenant)
    table.insert(fields, 'c:' .. tenant)
    table.insert(fields, 's:' .. tenant)
    table.insert(fields, 'w:' .. tenant)
  end
  local got = redis.call('HMGET', T, unpack(fields))
  for j, tenant in ipairs(chunk) do
    table.insert(out, tenant)
    table.insert(out, got[3 * j - 2] or '')
    table.insert(out, got[3 * j - 1] or '')
    table.insert(out, got[3 * j] or '')
  end
end
local floor = redis.call('ZRANGE', F, 0, 1, 'WITHSCORES')
return {out, floor, waiting, leases, replicas, current, nsince, nwsince, redis.call('GET', p .. ':rg') or '0', known}
"""

# Leaving: this replica's leases, backlog and wait stop counting at once. ARGV: prefix, replica, batch token,
# backend URLs...
LEAVE_LUA = """
local p, rid, token = ARGV[1], ARGV[2], ARGV[3]
redis.call('ZREM', p .. ':r', rid)
redis.call('HDEL', p .. ':st', rid)
redis.call('HDEL', p .. ':sn', token)
redis.call('ZREM', p .. ':seen', token)
local key = p .. ':bk:' .. rid
for _, tenant in ipairs(redis.call('SMEMBERS', key)) do
  if redis.call('HINCRBY', p .. ':bn', tenant, -1) <= 0 then
    redis.call('HDEL', p .. ':bn', tenant)
    redis.call('ZREM', p .. ':f:', tenant)
  end
end
redis.call('DEL', key)
for k = 4, #ARGV do
  for _, h in ipairs({':gr:', ':gt:', ':nr:', ':nt:'}) do redis.call('HDEL', p .. h .. ARGV[k], rid) end
end
return 1
"""


def sync_args(
    prefix: str,
    replica: str,
    ttl_ms: int,
    hold_ms: int,
    now_ms: int | str,
    read: tuple[str, str, str, int],
    batch: str,
    reset: bool,
    charges: list[Any],
    weights: list[Any],
    seeds: list[Any],
    backlog: tuple[str, list[str], list[str]],
    starved: str,
    backends: list[list[Any]],
) -> list[Any]:
    """SYNC_LUA's ARGV, in the layout above: `read` = (epoch, since, weights since, pull), `charges`, `weights`,
    `seeds` flat rows (6, 2 and 2 items each), `backlog` = (mode, now backlogged, no longer), `backends` 11 items
    each."""
    mode, added, gone = backlog
    return [
        prefix,
        replica,
        ttl_ms,
        hold_ms,
        now_ms,
        *read,
        batch,
        "1" if reset else "0",
        mode,
        len(charges) // 6,
        *charges,
        len(weights) // 2,
        *weights,
        len(seeds) // 2,
        *seeds,
        len(added),
        *added,
        len(gone),
        *gone,
        starved,
        len(backends),
        *(x for b in backends for x in b),
    ]
