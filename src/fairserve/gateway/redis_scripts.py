"""The atomic part of the shared state across gateway replicas: one Lua script Redis runs in one step per sync
(`shared_state.py` fills it, `shared_link.py` sends it), and `sync_args` / `leave_args`, the one place that lays
out its arguments.

Every replica pointing at the same Redis URL and key prefix `P` shares:
- each node's virtual counter and service, in one field ("COUNTER SERVICE": one read and one write for both), and
  its weight (hashes `P:cs`, `P:w`, keyed by the tenant, or by the group of the tenant tree: a replica's charge
  rows carry its groups' too, each the sum of its tenants' charges);
- which nodes are backlogged on which live replica (a dead replica's backlog is gone within `ttl_s`), and per
  parent the nodes backlogged anywhere scored by counter, for the lift (`redis_backlog.py`: that part of the
  script); the nodes backlogged on a replica that another one charged since its last sync (`P:d:REPLICA`, in its
  next answer, so that the counters it orders its queue by are never more than a sync late);
- the replicas alive (sorted set `P:r`, scored by expiry) and each replica's capacity lease on each backend
  (hashes `P:lr:URL` requests, `P:lt:URL` tokens: fields g:REPLICA) and its demand the lease does not cover
  (u:REPLICA), with their sums over the live replicas (g, u; `P:urls`, the backends seen): the leases of all
  live replicas never add up to more than the backend's `max_inflight_requests` / `max_inflight_tokens`, and a dead
  replica's lease stops counting after `ttl_s`; the replicas waiting for capacity (`P:st`, their heads per model
  pool; a sync that gives back room they wait for publishes to each one's channel `P:wake:REPLICA`);
- the data's epoch `P:e` (set when the first sync finds none) and change numbers (`P:seq`; sorted set `P:v`, each
  tenant scored by the number of its last change; `P:wseq`, `P:wv` the same for weights set by an admin), and the
  generation of counter resets `P:rg`;
- `P:sn`, the number of the last batch applied for each replica's token (`P:seen`: when each was last seen, so that
  the numbers of replicas gone for an hour are forgotten);
- `P:hold`, set for `hold_s` when a replica that had an epoch finds none (Redis lost its data): meanwhile no lease
  grows beyond what its replica has in flight, and each replica writes back the tenants it knows.

A sync costs what changed: every step touches the nodes this replica charged (a tenant and the groups above it),
lifted, or whose backlog it changed, at most `pull` nodes changed elsewhere, the replicas waiting for capacity, and
a few keys per backend; a replica that expired is read once, by the sync that finds it expired. Nothing walks all
tenants except a counter reset and the first sync of a replica (or of a Redis that lost its data), which reads them
all."""

from typing import Any

from .redis_backlog import BACKLOG_LUA

# One round trip per sync. ARGV: prefix, replica, ttl_ms, hold_ms, now_ms, epoch, since, weights since, pull, batch,
# reset (0/1), backlog mode ("+" changes, "=" the whole list), lifts (0/1: the policy lifts), then counted sections:
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
#   charges: n, then n x (node, service delta, counter delta, lift or "", base counter, base service)
#   weights set: n, then n x (tenant, weight);  weights seeded (only if unset): n, then n x (tenant, weight)
#   backlog: n nodes now backlogged here (mode "=": all of them), then n nodes no longer backlogged here
#   starved: "" or a JSON list, flat: tenant, pool per model pool whose head here may be admitted but finds no lease
#     with room (the head's tenant; the pool: its backends' URLs, sorted, space-separated)
#   backends: n, then n x (url, limit r, limit t or 0, in use r, in use t, need r, need t, spare r, spare t,
#                          keep r, keep t)
#     (need = in use + the queued demand this replica may admit now; spare = headroom beyond it, granted only
#      from capacity no other replica is waiting for; keep = the limit the replica admits within while this sync is
#      in flight: the new lease is never below it, or below its old lease, whichever is smaller; a replica told that
#      others wait leaves its spare out of keep, so that the spare is released at its next sync)
# Returns {tenants (nodes): those charged or newly backlogged here, those backlogged here and charged elsewhere,
#          the groups above other replicas' waiting heads, those changed since `since`; their "COUNTER SERVICE"
#          values (two lists in the same order; nil where unset),
#          the tenants whose weight was set since `weights since` and their weights (two lists), floor (flat:
#          node, counter: the two smallest counters backlogged at the top on any live replica), starved elsewhere (flat:
#          tenant, counter, pool, per waiting head of the other live replicas), leases (r, others waiting r (0/1),
#          t, others waiting t per backend), live replicas, epoch, since, weights since, reset generation,
#          known (0: Redis had forgotten this replica, and with it its backlog)}: `ANSWER` names them.
# NOTE: Lua's own work (making strings, calling commands) is most of a script's time:
# hashes keyed by the tenant itself, the answer's lists as HMGET returns them, and sums kept rather than recomputed.

SYNC_LUA = (
    """
local p, rid, ttl, hold_ms = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local epoch, since, wsince, pull = ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9])
local batch, reset, mode, lifts = ARGV[10], ARGV[11], ARGV[12], ARGV[13] == '1'
local t = redis.call('TIME')
local now = tonumber(ARGV[5]) or (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local i = 13
local function nxt() i = i + 1; return ARGV[i] end
local CS, W, V, WV, SEQ = p .. ':cs', p .. ':w', p .. ':v', p .. ':wv', p .. ':seq'
local F, ST, R = p .. ':f:', p .. ':st', p .. ':r'
local fmt = '%.17g'
-- NOTE: the change numbers as of now (read once, then counted here: the script is atomic), so none is read again
local seq, wseq = 0, 0
local function bump(n) seq = redis.call('INCRBY', SEQ, n); return seq - n end
local function wbump() wseq = redis.call('INCR', p .. ':wseq'); return wseq end
local function touch(tenant) redis.call('ZADD', V, bump(1) + 1, tenant) end
-- the values this script wrote (or read) for a node: `known`, its "COUNTER SERVICE" field (false: none), and
-- `known_c` its counter: the answer needs no HMGET for them
local known, known_c = {}, {}
local function split(v)  -- "COUNTER SERVICE": the two strings
  local sp = string.find(v, ' ', 1, true)
  return string.sub(v, 1, sp - 1), string.sub(v, sp + 1)
end
local rows, listed = {}, {}
local function row(tenant)
  if not listed[tenant] then listed[tenant] = true; rows[#rows + 1] = tenant end
end
"""
    + BACKLOG_LUA
    + """
-- a replica gone (expired, or left): its lease and unmet demand on each backend (`P:lK:URL`, K = r requests, t
-- tokens: fields g:REPLICA, u:REPLICA) leave their sums (fields g, u), its backlog and its wait stop counting
local function drop(r)
  for _, url in ipairs(redis.call('SMEMBERS', p .. ':urls')) do
    for _, k in ipairs({'r', 't'}) do
      local key = p .. ':l' .. k .. ':' .. url
      local v = redis.call('HMGET', key, 'g', 'u', 'g:' .. r, 'u:' .. r)
      if v[3] then
        redis.call('HSET', key, 'g', tonumber(v[1]) - tonumber(v[3]), 'u', tonumber(v[2]) - tonumber(v[4]))
        redis.call('HDEL', key, 'g:' .. r, 'u:' .. r)
      end
    end
  end
  local key = p .. ':bk:' .. r
  for _, tenant in ipairs(redis.call('SMEMBERS', key)) do unbacklog(r, tenant) end
  redis.call('DEL', key, p .. ':d:' .. r)
  redis.call('HDEL', ST, r)
  redis.call('ZREM', R, r)
end
if mode == 'leave' then  -- leaving: at once, and the batch numbers are forgotten (`batch` is the token)
  drop(rid)
  write_floor()
  local st = redis.call('HGETALL', ST)
  for j = 1, #st, 2 do redis.call('PUBLISH', p .. ':wake:' .. st[j], '1') end
  redis.call('HDEL', p .. ':sn', batch)
  redis.call('ZREM', p .. ':seen', batch)
  return 1
end
-- NOTE: the few single values a sync reads, in one call (a script's time is mostly its calls)
local single = redis.call('MGET', p .. ':e', p .. ':hold', p .. ':rg', SEQ, p .. ':wseq')
local current, hold_until, generation = single[1], tonumber(single[2] or '-1'), single[3] or '0'
seq, wseq = tonumber(single[4] or '0'), tonumber(single[5] or '0')
local seq0 = seq  -- NOTE: the changes after it are this sync's own, all in its answer already
if not current then
  current = t[1] .. '.' .. t[2]
  redis.call('SET', p .. ':e', current)
  if epoch ~= '' then
    hold_until = now + hold_ms
    redis.call('SET', p .. ':hold', hold_until)
  end
end
-- replicas (sorted set `P:r`, scored by expiry): only the expired ones are read
for _, r in ipairs(redis.call('ZRANGEBYSCORE', R, '-inf', now)) do drop(r) end
write_floor()
local known_replica = redis.call('ZADD', R, now + ttl, rid) == 0 and 1 or 0  -- 0: added: Redis did not know it
local replicas = redis.call('ZCARD', R)
hold = hold_until > now
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
  generation = redis.call('INCR', p .. ':rg')
  local all, values = {}, redis.call('HGETALL', CS)
  for j = 1, #values, 2 do
    all[#all + 1] = values[j]
    local _, service = split(values[j + 1])
    values[j + 1] = '0 ' .. service
  end
  for a = 1, #values, 2000 do
    redis.call('HSET', CS, unpack(values, a, math.min(a + 1999, #values)))
  end
  for key, idx in pairs(by_floor(all)) do  -- NOTE: each backlogged node's floor score too (XX: only those there)
    for a = 1, #idx, 1000 do
      local set = {}
      for j = a, math.min(a + 999, #idx) do set[#set + 1] = '0'; set[#set + 1] = all[idx[j]] end
      redis.call('ZADD', key, 'XX', unpack(set))
    end
  end
end
-- the charges, a few commands for all of them (in chunks, as unpack() has a limit); one change number each
-- (a row's fields are read from ARGV where they are, `at`: a script's time is mostly Lua's own work)
local names, at, tree = {}, {}, false
for j = 1, tonumber(nxt()) do
  local tenant = nxt()
  names[j], at[j] = tenant, i
  i = i + 5
  if not tree and string.find(tenant, '/', 1, true) then tree = true end
  row(tenant)
end
if fresh and #names > 0 then
  local k = bump(#names)
  for a = 1, #names, 1000 do
    local b = math.min(a + 999, #names)
    local chunk = (a == 1 and b == #names) and names or {unpack(names, a, b)}
    local old = redis.call('HMGET', CS, unpack(chunk))
    -- each node's score on its siblings' floor: one call per parent (one for all when nobody is below the top)
    local backlogged, floors = tree and {} or redis.call('ZMSCORE', F, unpack(chunk)), {}
    if tree then
      for key, idx in pairs(by_floor(chunk)) do
        local some = {}
        for q, j in ipairs(idx) do some[q] = chunk[j] end
        local scores = redis.call('ZMSCORE', key, unpack(some))
        for q, j in ipairs(idx) do backlogged[j] = scores[q] end
      end
    end
    local set, log = {}, {}
    for j = a, b do
      local tenant, q, x = names[j], j - a + 1, at[j]
      local ds, dc, lift = tonumber(ARGV[x + 1]), tonumber(ARGV[x + 2]), ARGV[x + 3]
      local c, s
      if old[q] then
        c, s = split(old[q])
        c, s = tonumber(c), tonumber(s)
      else
        c, s = tonumber(ARGV[x + 4]), tonumber(ARGV[x + 5])
      end
      if lift ~= '' then c = math.max(c, tonumber(lift)) end
      local cs = string.format(fmt, c + dc)
      local v = cs .. ' ' .. string.format(fmt, s + ds)
      dcs[tenant], known_c[tenant], known[tenant] = dc, cs, v
      k = k + 1
      set[2 * q - 1], set[2 * q] = tenant, v
      log[2 * q - 1], log[2 * q] = k, tenant
      if backlogged[q] then  -- its new counter on the floor; the other replicas that backlog it hear of it next
        local key = tree and floor_key(tenant) or F
        local floor = floors[key]
        if not floor then floor = {}; floors[key] = floor end
        floor[#floor + 1], floor[#floor + 2] = cs, tenant
        members[tenant] = redis.call('SMEMBERS', p .. ':bt:' .. tenant)
        for _, r in ipairs(members[tenant]) do
          if r ~= rid then redis.call('SADD', p .. ':d:' .. r, tenant) end
        end
      end
    end
    redis.call('HSET', CS, unpack(set))
    for key, floor in pairs(floors) do redis.call('ZADD', key, unpack(floor)) end
    redis.call('ZADD', V, unpack(log))
  end
end
for _ = 1, tonumber(nxt()) do
  local tenant, w = nxt(), nxt()
  if fresh then
    redis.call('HSET', W, tenant, w)
    touch(tenant)
    redis.call('ZADD', WV, wbump(), tenant)
  end
  row(tenant)
end
for _ = 1, tonumber(nxt()) do
  local tenant = nxt()
  if redis.call('HSETNX', W, tenant, nxt()) == 1 then
    touch(tenant)
    redis.call('ZADD', WV, wbump(), tenant)
  end
end
local bk = p .. ':bk:' .. rid
if mode == '=' then
  local want = {}
  for _ = 1, tonumber(nxt()) do
    local tenant = nxt()
    want[tenant] = true
    backlog(rid, tenant)
    row(tenant)
  end
  for _, tenant in ipairs(redis.call('SMEMBERS', bk)) do
    if not want[tenant] then
      redis.call('SREM', bk, tenant)
      unbacklog(rid, tenant)
    end
  end
else
  for _ = 1, tonumber(nxt()) do
    local tenant = nxt()
    backlog(rid, tenant)
    row(tenant)
  end
end
for _ = 1, tonumber(nxt()) do
  local tenant = nxt()
  if redis.call('SREM', bk, tenant) == 1 then unbacklog(rid, tenant) end
end
write_floor()
-- the replicas waiting for capacity (`P:st`: their heads; a gone replica's entry is dropped with it)
local starved, mine = nxt(), nil
local waiting, heads, pools = {}, {}, {}
local st = redis.call('HGETALL', ST)
for j = 1, #st, 2 do
  if st[j] ~= rid then
    local got = cjson.decode(st[j + 1])
    for q = 1, #got, 2 do heads[#heads + 1], pools[#pools + 1] = got[q], got[q + 1] end
  else
    mine = st[j + 1]
  end
end
if starved ~= '' then
  if mine ~= starved then redis.call('HSET', ST, rid, starved) end
elseif mine then
  redis.call('HDEL', ST, rid)
end
if #heads > 0 then
  local values = redis.call('HMGET', CS, unpack(heads))
  for j, tenant in ipairs(heads) do
    waiting[3 * j - 2], waiting[3 * j - 1], waiting[3 * j] = tenant, values[j] and split(values[j]) or '0', pools[j]
    local node = parent(tenant)  -- NOTE: and the groups above it, which a replica compares its head's with
    while node do row(node); node = parent(node) end
  end
end
local leases, released = {}, false
local function lease(k, url, limit, used, need, spare, keep)
  -- at least what is in flight and what the replica may admit before it reads this answer (never more than the
  -- lease it already had); the demand as far as the others' leases leave room; the spare only from what nobody
  -- else is waiting for. The others' leases and unmet demand are the sums less this replica's part.
  local key, gf, uf = p .. ':l' .. k .. ':' .. url, 'g:' .. rid, 'u:' .. rid
  local v = redis.call('HMGET', key, 'g', 'u', gf, uf)
  if not v[3] then redis.call('SADD', p .. ':urls', url) end
  local old, old_u = tonumber(v[3] or '0'), tonumber(v[4] or '0')
  local held, unmet = tonumber(v[1] or '0') - old, tonumber(v[2] or '0') - old_u
  local g = used
  if not hold then
    g = math.max(used, math.min(need, limit - held))
    g = g + math.max(0, math.min(spare, limit - held - unmet - g))
  end
  g = math.max(g, math.min(keep, old))
  local u = math.max(0, need - g)
  if g ~= old or u ~= old_u or not v[3] then
    redis.call('HSET', key, gf, g, uf, u, 'g', held + g, 'u', unmet + u)
  end
  if g < old and unmet > 0 then released = true end
  leases[#leases + 1] = g
  leases[#leases + 1] = unmet > 0 and 1 or 0
end
for _ = 1, tonumber(nxt()) do
  local url, lr, lt, ur, ut, nr, nt, sr, st, kr, kt = nxt(), tonumber(nxt()), tonumber(nxt()), tonumber(nxt()),
    tonumber(nxt()), tonumber(nxt()), tonumber(nxt()), tonumber(nxt()), tonumber(nxt()), tonumber(nxt()),
    tonumber(nxt())
  lease('r', url, lr, ur, nr, sr, kr)
  if lt > 0 then lease('t', url, lt, ut, nt, st, kt) else leases[#leases + 1] = 0; leases[#leases + 1] = 0 end
end
-- room given back while others wait: the waiting replicas sync now rather than at their next interval
if released then
  for j = 1, #st, 2 do
    if st[j] ~= rid then redis.call('PUBLISH', p .. ':wake:' .. st[j], '1') end
  end
end
-- what changed elsewhere: the oldest changes first, at most `pull` (all tenants for a replica new to this data)
local d = redis.call('SMEMBERS', p .. ':d:' .. rid)
if #d > 0 then
  for _, tenant in ipairs(d) do row(tenant) end
  redis.call('DEL', p .. ':d:' .. rid)
end
-- weights: only those set (by an admin, or seeded) since `weights since` (every tenant's for a replica new to this
-- data), as the other changes do not move them
local nsince, nwsince, wrows
if current ~= epoch then
  for _, tenant in ipairs(redis.call('ZRANGE', V, 0, -1)) do row(tenant) end
  nsince, nwsince, wrows = string.format('%d', seq), string.format('%d', wseq), rows
else
  -- NOTE: up to the changes this sync made (its own: in the answer's rows already), so that they are not pulled
  -- back later: once the others' changes are all read, `since` moves past this sync's own
  local got = redis.call('ZRANGEBYSCORE', V, '(' .. since, seq0, 'WITHSCORES', 'LIMIT', 0, pull)
  for j = 1, #got, 2 do row(got[j]) end
  nsince = #got > 0 and #got == 2 * pull and got[#got] or string.format('%d', seq)
  wrows, nwsince = {}, wsince
  if wseq > (tonumber(wsince) or 0) then  -- NOTE: no weight set since: nothing to ask
    local wgot = redis.call('ZRANGEBYSCORE', WV, '(' .. wsince, '+inf', 'WITHSCORES')
    for j = 1, #wgot, 2 do wrows[#wrows + 1] = wgot[j] end
    nwsince = #wgot > 0 and wgot[#wgot] or wsince
  end
end
local function values(key, list, known)  -- HMGET (in chunks, as unpack() has a limit) of those not `known`
  local ask, out = {}, {}
  for _, node in ipairs(list) do
    if known[node] == nil then ask[#ask + 1] = node end
  end
  for a = 1, #ask, 1000 do
    local b = math.min(a + 999, #ask)
    for q, v in ipairs(redis.call('HMGET', key, unpack(ask, a, b))) do known[ask[a + q - 1]] = v end
  end
  for j, node in ipairs(list) do out[j] = known[node] end
  return out
end
local floor = redis.call('ZRANGE', F, 0, 1, 'WITHSCORES')
return {rows, values(CS, rows, known), wrows, values(W, wrows, {}), floor, waiting, leases, replicas, current, nsince,
  nwsince, generation, known_replica}
"""
)
# The answer's parts, in order (the comment above SYNC_LUA says what each holds).
ANSWER = (
    "tenants", "values", "weighted", "weights", "floor", "starved", "leases", "replicas", "epoch",
    "since", "weights_since", "generation", "known",
)  # fmt: skip


def sync_args(
    prefix: str,
    replica: str,
    ttl_ms: int,
    hold_ms: int,
    now_ms: int | str,
    read: tuple[str, str, str, int],
    batch: str,
    reset: bool,
    lifts: bool,
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
        "1" if lifts else "0",
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


def leave_args(prefix: str, replica: str, token: str) -> list[Any]:
    """SYNC_LUA's ARGV for leaving: the replica's leases, backlog and wait stop counting at once, and the numbers of
    its batches (`token`) are forgotten."""
    return [prefix, replica, "", "", "", "", "", "", "", token, "", "leave", ""]
