"""The backlog across gateway replicas and the counter lift over it: the part of the sync script (`redis_scripts.py`,
which includes this text) that records which nodes of the tenant tree (tenants and groups) are backlogged on which
replica, keeps the floors the lift reads, and lifts a node below the top of the tree.

Keys (prefix `P`): `P:bk:REPLICA`, the nodes backlogged on a replica; `P:bt:NODE`, the replicas a node is
backlogged on; `P:f:PARENT` (`P:f:` at the top), the nodes under one parent backlogged on any replica, scored by
their counters (a score is always the node's counter in `P:cs`), so that the smallest among a node's siblings is read
in O(log n). A node that becomes backlogged anywhere below the top is lifted to the smallest counter among its
siblings there, net of what the same sync charged it, and that counter is the one every replica takes; a replica
lifts a node at the top itself, from the two smallest counters an answer gives it, and sends the lift with its
charges. Nodes of one parent that join in one sync do not lift each other (as arrivals in one instant).

What it uses of the script around it: `p`, `F`, `CS`, `V`, `fmt`, `lifts`, `bump`, `split`, `known` and `known_c`
(the values and counters this sync read or wrote); what it gives it: `backlog(replica, node)`, `unbacklog(replica,
node)` (gathered), `write_floor()` (written, before anything reads a floor), `members` (the replicas a charged node
is backlogged on, as read by the charges), `dcs` (what this batch charged each node), `hold` (set by the script: no
lift while Redis's data is being restored), `parent(node)`, `floor_key(node)`, `by_floor(nodes)`."""

BACKLOG_LUA = """
-- a node's parent in the tenant tree ('' at the top), and the key of the floor among its siblings (`P:f:PARENT`)
local function parent(node)
  if not string.find(node, '/', 1, true) then return nil end  -- NOTE: a plain search first: most are at the top
  return string.match(node, '^(.*)/')
end
local function floor_key(node)
  local up = parent(node)
  return up and F .. up or F
end
local function by_floor(list)  -- the nodes of `list` by the key of their siblings' floor
  local out = {}
  for j, node in ipairs(list) do
    local up = parent(node)
    local key = up and F .. up or F  -- NOTE: no new string for a node at the top
    local l = out[key]
    if not l then l = {}; out[key] = l end
    l[#l + 1] = j
  end
  return out
end
-- the floors' changes are gathered, then written in a few calls by `write_floor()`.
-- NOTE: a node newly backlogged here goes (back) onto its floor with its counter: the score of a node backlogged
-- elsewhere already is that counter, so the write changes nothing for it, and no call asks whether it was there
-- (only the lift below the top asks, one call per parent). A node no longer backlogged here leaves the floor when
-- no replica backlogs it: known without asking for a node whose replicas this sync read (`members`, its charge)
local fadd, fdel, dcs, members = {}, {}, {}, {}
local function backlog(r, tenant)
  if redis.call('SADD', p .. ':bk:' .. r, tenant) == 1 and redis.call('SADD', p .. ':bt:' .. tenant, r) == 1 then
    fadd[#fadd + 1] = tenant
  end
end
local function unbacklog(r, tenant)
  if redis.call('SREM', p .. ':bt:' .. tenant, r) == 1 then
    local m, empty = members[tenant], true
    if m then
      for _, other in ipairs(m) do
        if other ~= r then empty = false; break end
      end
    else
      empty = redis.call('EXISTS', p .. ':bt:' .. tenant) == 0
    end
    if empty then fdel[#fdel + 1] = tenant end
  end
end
-- the lift below the top (see above): not while Redis's data is restored (`hold`), nor for a policy without it
local hold = false
local function write_floor()  -- NOTE: before anything reads `P:f:`; in chunks, as unpack() has a limit
  if #fadd > 0 then
    local lifted = {}
    for key, idx in pairs(by_floor(fadd)) do
      local low = (lifts and not hold and key ~= F) and redis.call('ZRANGE', key, 0, 0, 'WITHSCORES') or {}
      local floor = low[2] and tonumber(low[2])
      for a = 1, #idx, 1000 do
        local b, names, unknown = math.min(a + 999, #idx), {}, {}
        for j = a, b do
          local node = fadd[idx[j]]
          names[#names + 1] = node
          if not known_c[node] then unknown[#unknown + 1] = node end
        end
        if #unknown > 0 then
          for q, v in ipairs(redis.call('HMGET', CS, unpack(unknown))) do
            known[unknown[q]], known_c[unknown[q]] = v, v and split(v)
          end
        end
        local there = floor and redis.call('ZMSCORE', key, unpack(names)) or {}  -- on the floor: backlogged elsewhere
        local set = {}
        for q, node in ipairs(names) do
          local c = known_c[node] or '0'
          local dc = dcs[node] or 0
          if floor and not there[q] and tonumber(c) - dc < floor then
            c = string.format(fmt, floor + dc)
            local _, service = split(known[node] or '0 0')
            known_c[node], known[node] = c, c .. ' ' .. service
            lifted[#lifted + 1] = node; lifted[#lifted + 1] = known[node]
          end
          set[#set + 1] = c; set[#set + 1] = node
        end
        redis.call('ZADD', key, unpack(set))
      end
    end
    if #lifted > 0 then
      redis.call('HSET', CS, unpack(lifted))
      local k, log = bump(#lifted / 2), {}
      for j = 1, #lifted, 2 do k = k + 1; log[j], log[j + 1] = k, lifted[j] end
      redis.call('ZADD', V, unpack(log))
    end
  end
  if #fdel > 0 then
    for key, idx in pairs(by_floor(fdel)) do
      for a = 1, #idx, 1000 do
        local names = {}
        for j = a, math.min(a + 999, #idx) do names[#names + 1] = fdel[idx[j]] end
        redis.call('ZREM', key, unpack(names))
      end
    end
  end
  fadd, fdel = {}, {}
end
"""
