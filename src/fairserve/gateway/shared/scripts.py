"""The atomic part of the shared state across gateway replicas: one Lua script Redis runs in one step per sync
(`shared_state.py` fills it, `shared_link.py` sends it); its arguments and its answer are laid out once, in
`sync_codec.py`, whose places the text below reads (`$section.field`, filled in by `sync_codec.bind`).

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

from .backlog import BACKLOG_LUA
from .codec import ANSWER, bind, describe

# One round trip per sync. ARGV and the answer: as `sync_codec.py` lays them out (`BatchHead`, `SECTIONS`,
# `ANSWER`); each section is read where `-- ARGV section: NAME` marks it, in the layout's order.
# NOTE: Lua's own work (making strings, calling commands) is most of a script's time:
# hashes keyed by the tenant itself, the answer's lists as HMGET returns them, and sums kept rather than recomputed.

SYNC_TEMPLATE = (
    """
local p, rid = ARGV[$head.prefix], ARGV[$head.replica]
local ttl, hold_ms = tonumber(ARGV[$head.ttl_ms]), tonumber(ARGV[$head.hold_ms])
local epoch, since, wsince = ARGV[$head.epoch], ARGV[$head.since], ARGV[$head.weights_since]
local pull, batch, reset = tonumber(ARGV[$head.pull]), ARGV[$head.batch], ARGV[$head.reset]
local mode, lifts = ARGV[$head.mode], ARGV[$head.lifts] == '1'
local t = redis.call('TIME')
local now = tonumber(ARGV[$head.now_ms]) or (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local i = $head.width
local function nxt() i = i + 1; return ARGV[i] end
local function num(k) return tonumber(ARGV[k]) end
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
-- ARGV section: charges
local names, at, tree = {}, {}, false
for j = 1, tonumber(nxt()) do
  local x = i + 1  -- NOTE: a row's places count from its first argument
  local tenant = ARGV[x + $charges.node]
  names[j], at[j] = tenant, x
  i = i + $charges.width
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
      local ds, dc, lift = tonumber(ARGV[x + $charges.service]), tonumber(ARGV[x + $charges.counter]),
        ARGV[x + $charges.lift]
      local c, s
      if old[q] then
        c, s = split(old[q])
        c, s = tonumber(c), tonumber(s)
      else
        c, s = tonumber(ARGV[x + $charges.base_counter]), tonumber(ARGV[x + $charges.base_service])
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
-- ARGV section: weights
for _ = 1, tonumber(nxt()) do
  local tenant, w = ARGV[i + 1 + $weights.tenant], ARGV[i + 1 + $weights.weight]
  i = i + $weights.width
  if fresh then
    redis.call('HSET', W, tenant, w)
    touch(tenant)
    redis.call('ZADD', WV, wbump(), tenant)
  end
  row(tenant)
end
-- ARGV section: seeds
for _ = 1, tonumber(nxt()) do
  local tenant, w = ARGV[i + 1 + $seeds.tenant], ARGV[i + 1 + $seeds.weight]
  i = i + $seeds.width
  if redis.call('HSETNX', W, tenant, w) == 1 then
    touch(tenant)
    redis.call('ZADD', WV, wbump(), tenant)
  end
end
local bk = p .. ':bk:' .. rid
-- ARGV section: backlogged
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
-- ARGV section: unbacklogged
for _ = 1, tonumber(nxt()) do
  local tenant = nxt()
  if redis.call('SREM', bk, tenant) == 1 then unbacklog(rid, tenant) end
end
write_floor()
-- the replicas waiting for capacity (`P:st`: their heads; a gone replica's entry is dropped with it)
-- ARGV section: starved
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
    local w = $waiting.width * (j - 1) + 1
    waiting[w + $waiting.tenant], waiting[w + $waiting.counter], waiting[w + $waiting.pool] =
      tenant, values[j] and split(values[j]) or '0', pools[j]
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
  return g, unmet > 0 and 1 or 0
end
-- ARGV section: backends
for _ = 1, tonumber(nxt()) do
  local x, o = i + 1, #leases + 1
  i = i + $backends.width
  local url, lt = ARGV[x + $backends.url], num(x + $backends.limit_tokens)
  leases[o + $lease.requests], leases[o + $lease.others_wait_requests] = lease('r', url,
    num(x + $backends.limit_requests), num(x + $backends.used_requests), num(x + $backends.need_requests),
    num(x + $backends.spare_requests), num(x + $backends.keep_requests))
  if lt > 0 then
    leases[o + $lease.tokens], leases[o + $lease.others_wait_tokens] = lease('t', url, lt,
      num(x + $backends.used_tokens), num(x + $backends.need_tokens), num(x + $backends.spare_tokens),
      num(x + $backends.keep_tokens))
  else
    leases[o + $lease.tokens], leases[o + $lease.others_wait_tokens] = 0, 0
  end
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
"""
)
# What the script answers for each part of the answer (`sync_codec.ANSWER`): the return is written in the layout's
# order. NOTE: a plain list, as before the layout: a table of keyed places cost ~4 µs more per sync (sync_sections.py)
ANSWER_LUA = {
    "tenants": "rows", "values": "values(CS, rows, known)", "weighted": "wrows", "weights": "values(W, wrows, {})",
    "floor": "floor", "starved": "waiting", "leases": "leases", "replicas": "replicas", "epoch": "current",
    "since": "nsince", "weights_since": "nwsince", "generation": "generation", "known": "known_replica",
}  # fmt: skip
SYNC_LUA = describe() + bind(SYNC_TEMPLATE) + f"return {{{', '.join(ANSWER_LUA[part] for part in ANSWER)}}}\n"
