"""Where the keys made through the API are kept, so that a restart keeps them: with the shared state, in its Redis
(`RedisKeys`: every replica reads the same keys); without it, in a file beside the snapshot (`FileKeys`,
`SNAPSHOT.keys`). Each store holds records (never a key), each key's last use (unix seconds), and the tenants the API
made (gateway/keys/tenants.py): each made with its first key, dropped with its last, in the same write."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Protocol

from ...tenancy import TenantConfig
from ..shared.snapshot import write
from .book import KeyRecord
from .tenants import read_tenant, tenant_doc

log = logging.getLogger("fairserve.gateway")
FORMAT = "fairserve-gateway-keys/1"
Loaded = tuple[list[KeyRecord], list[TenantConfig]]  # the records, and the tenants the API made


class KeyStore(Protocol):
    kind: str  # "redis" or "file" (`GET /admin/keys` says where its keys are kept)

    async def load(self, held: Loaded) -> Loaded | None:
        """Every record and tenant, or None when nothing changed since the last load (`held`: this replica's)."""
        ...

    async def create(self, rec: KeyRecord, tenant: TenantConfig | None, made_by_api: bool) -> int:
        """The key kept, and `tenant` (a new one, the key's) with it: 1; nothing kept: 0 where the store has a tenant
        of that name already, -1 where the key's tenant is one the API made (`made_by_api`) and it is gone."""
        ...

    async def revoke(self, key_id: str) -> bool:
        """Whether there was such a key (it is gone from the store either way); a tenant the API made goes with its
        last key."""
        ...

    async def flush(self, used: dict[str, int]) -> None:
        """Keys' latest uses (id -> unix second), each kept where it is later than the stored one."""
        ...

    async def last_used(self) -> dict[str, int]: ...


def keys_path(snapshot: str) -> str:
    """The file of the keys made through the API beside a snapshot file."""
    return snapshot + ".keys"


class FileKeys:
    """A JSON file (`{"format", "keys": {ID: RECORD}, "used": {ID: SECOND}, "tenants": {NAME: TENANT}}`), replaced
    atomically at each create and
    revoke and at each flush of the last uses. Read at construction: ValueError (one line) when it is not such a
    file, or none can be written there."""

    kind = "file"

    def __init__(self, path: str) -> None:
        self.path = path
        self.records: dict[str, KeyRecord] = {}
        self.used: dict[str, int] = {}
        self.tenants: dict[str, TenantConfig] = {}
        self._loaded = False
        self._writing = asyncio.Lock()  # NOTE: one write at a time: each goes through the same temporary file
        p = Path(path)
        if not p.exists():
            parent = p.parent if str(p.parent) else Path(".")
            if not parent.is_dir():
                raise ValueError(f"keys file {path}: {parent} is not a directory")
            return
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
            if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("keys"), dict):
                raise ValueError(f"not a {FORMAT} file")
            self.records = {i: KeyRecord.read(r) for i, r in doc["keys"].items()}
            used = doc.get("used", {})
            self.used = {i: int(s) for i, s in used.items() if i in self.records} if isinstance(used, dict) else {}
            tenants = doc.get("tenants", {})
            if not isinstance(tenants, dict):
                raise ValueError("tenants: not an object")
            self.tenants = {n: read_tenant(t) for n, t in tenants.items()}
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as e:
            raise ValueError(
                f"keys file {path} cannot be read ({e}); fix or move it away (its keys stop working)"
            ) from None

    async def _save(self) -> None:
        keys = {i: r.doc() for i, r in self.records.items()}  # NOTE: on the loop, so it is consistent; written off it
        tenants = {n: tenant_doc(t) for n, t in self.tenants.items()}
        doc = {"format": FORMAT, "keys": keys, "used": dict(self.used), "tenants": tenants}
        async with self._writing:
            await asyncio.to_thread(write, self.path, doc)

    async def load(self, held: Loaded) -> Loaded | None:
        if self._loaded:
            return None  # NOTE: one process writes this file: what it holds is what the file holds
        self._loaded = True
        return list(self.records.values()), list(self.tenants.values())

    async def create(self, rec: KeyRecord, tenant: TenantConfig | None, made_by_api: bool) -> int:
        if tenant is not None and tenant.name in self.tenants:
            return 0
        if made_by_api and rec.tenant not in self.tenants:
            return -1
        self.records[rec.id] = rec
        if tenant is not None:
            self.tenants[tenant.name] = tenant
        try:
            await self._save()
        except OSError:
            del self.records[rec.id]
            if tenant is not None:
                del self.tenants[tenant.name]
            raise
        return 1

    async def revoke(self, key_id: str) -> bool:
        rec = self.records.pop(key_id, None)
        if rec is None:
            return False
        self.used.pop(key_id, None)
        if rec.tenant in self.tenants and all(r.tenant != rec.tenant for r in self.records.values()):
            del self.tenants[rec.tenant]
        await self._save()
        return True

    async def flush(self, used: dict[str, int]) -> None:
        for i, s in used.items():
            if i in self.records and s > self.used.get(i, 0):
                self.used[i] = s
        await self._save()

    async def last_used(self) -> dict[str, int]:
        return dict(self.used)


# KEYS: the records' hash, the version, the tenants, the tenant's keys (a set); ARGV: the id, its record, its tenant,
# the tenant's record ('' for a key of an existing tenant), and '1' where that tenant is one the API made (it must
# still be there). 1: kept, 0: the API made a tenant of that name already, -1: the API's tenant is gone
CREATE_LUA = """
if ARGV[4] ~= '' then
  if redis.call('HSETNX', KEYS[3], ARGV[3], ARGV[4]) == 0 then return 0 end
elseif ARGV[5] == '1' and redis.call('HEXISTS', KEYS[3], ARGV[3]) == 0 then
  return -1
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('INCR', KEYS[2])
return 1
"""

# KEYS: the records' hash, the version, the last uses, the tenants; ARGV: the id, the prefix of a tenant's set of
# keys. 1: revoked, 0: no such key. A tenant the API made goes with the last key of its set (a record that does not
# decode is revoked all the same)
REVOKE_LUA = """
local doc = redis.call('HGET', KEYS[1], ARGV[1])
if not doc then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
local ok, rec = pcall(cjson.decode, doc)
if ok and type(rec) == 'table' and type(rec['tenant']) == 'string' then
  local of = ARGV[2] .. rec['tenant']
  if redis.call('SREM', of, ARGV[1]) == 1 and redis.call('SCARD', of) == 0 then
    redis.call('HDEL', KEYS[4], rec['tenant'])
  end
end
return 1
"""

# KEYS: the records' hash, the last uses; ARGV: pairs of id and unix second. A revoked key's use is not kept
FLUSH_LUA = """
for i = 1, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then redis.call('ZADD', KEYS[2], 'GT', ARGV[i + 1], ARGV[i]) end
end
return 0
"""


class RedisKeys:
    """In the shared state's Redis: a hash of the records (`PREFIX:keys`, ID -> JSON), a version that every create
    and revoke increments (`PREFIX:keys:v`: a replica re-reads the hashes when it moved), a sorted set of the last
    uses (`PREFIX:keys:used`, ID -> unix second, only ever raised: `ZADD GT`), the tenants the API made
    (`PREFIX:keys:tenants`, NAME -> JSON) and each tenant's keys (`PREFIX:keys:of:NAME`, a set of ids)."""

    kind = "redis"

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.hash, self.version_key, self.used_key = f"{prefix}:keys", f"{prefix}:keys:v", f"{prefix}:keys:used"
        self.tenants_key, self.of_prefix = f"{prefix}:keys:tenants", f"{prefix}:keys:of:"  # + a tenant: its keys
        self.version: bytes | None = None  # as last read
        self._create = client.register_script(CREATE_LUA)
        self._revoke = client.register_script(REVOKE_LUA)
        self._flush = client.register_script(FLUSH_LUA)

    async def load(self, held: Loaded) -> Loaded | None:
        version = await self.client.get(self.version_key)
        records, tenants = held
        if version is None and records:
            # NOTE: Redis lost its data (restarted without persistence): what this replica holds is written back
            log.warning("the shared state lost the keys made through the API: %d written back", len(records))
            async with self.client.pipeline(transaction=True) as pipe:
                for rec in records:  # NOTE: each write a union with what is there: replicas write back in turn
                    pipe.hsetnx(self.hash, rec.id, json.dumps(rec.doc()))
                    pipe.sadd(self.of_prefix + rec.tenant, rec.id)
                for t in tenants:
                    pipe.hsetnx(self.tenants_key, t.name, json.dumps(tenant_doc(t)))
                pipe.incr(self.version_key)
                await pipe.execute()
            return None
        if version == self.version:
            return None
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.hash)
            pipe.hgetall(self.tenants_key)
            raw, raw_tenants = await pipe.execute()
        self.version = version
        out = []
        for key_id, doc in raw.items():
            try:
                out.append(KeyRecord.read(json.loads(doc)))
            except ValueError as e:  # NOTE: one bad record costs that key, not the others
                log.error("key record %r in %s skipped: %s", key_id, self.hash, e)
        made = []
        for name, doc in raw_tenants.items():
            try:
                made.append(read_tenant(json.loads(doc)))
            except ValueError as e:
                log.error("tenant record %r in %s skipped: %s", name, self.tenants_key, e)
        return out, made

    async def create(self, rec: KeyRecord, tenant: TenantConfig | None, made_by_api: bool) -> int:
        made = json.dumps(tenant_doc(tenant)) if tenant is not None else ""
        keys = [self.hash, self.version_key, self.tenants_key, self.of_prefix + rec.tenant]
        args = [rec.id, json.dumps(rec.doc()), rec.tenant, made, "1" if made_by_api else ""]
        return int(await self._create(keys=keys, args=args))

    async def revoke(self, key_id: str) -> bool:
        keys = [self.hash, self.version_key, self.used_key, self.tenants_key]
        return bool(await self._revoke(keys=keys, args=[key_id, self.of_prefix]))

    async def flush(self, used: dict[str, int]) -> None:
        if used:
            await self._flush(keys=[self.hash, self.used_key], args=[v for pair in used.items() for v in pair])

    async def last_used(self) -> dict[str, int]:
        got = await self.client.zrange(self.used_key, 0, -1, withscores=True)
        return {(i.decode() if isinstance(i, bytes) else i): int(s) for i, s in got}
