"""Where the keys made through the API are kept, so that a restart keeps them: with the shared state, in its Redis
(`RedisKeys`: every replica reads the same keys); without it, in a file beside the snapshot (`FileKeys`,
`SNAPSHOT.keys`). Each store holds records (never a key) and each key's last use (unix seconds)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Protocol

from ..shared.snapshot import write
from .book import KeyRecord

log = logging.getLogger("fairserve.gateway")
FORMAT = "fairserve-gateway-keys/1"


class KeyStore(Protocol):
    kind: str  # "redis" or "file" (`GET /admin/keys` says where its keys are kept)

    async def load(self, held: list[KeyRecord]) -> list[KeyRecord] | None:
        """Every record, or None when nothing changed since the last load (`held`: the records this replica holds)."""
        ...

    async def create(self, rec: KeyRecord) -> None: ...

    async def revoke(self, key_id: str) -> bool:
        """Whether there was such a key (it is gone from the store either way)."""
        ...

    async def flush(self, used: dict[str, int]) -> None:
        """Keys' latest uses (id -> unix second), each kept where it is later than the stored one."""
        ...

    async def last_used(self) -> dict[str, int]: ...


def keys_path(snapshot: str) -> str:
    """The file of the keys made through the API beside a snapshot file."""
    return snapshot + ".keys"


class FileKeys:
    """A JSON file (`{"format", "keys": {ID: RECORD}, "used": {ID: SECOND}}`), replaced atomically at each create and
    revoke and at each flush of the last uses. Read at construction: ValueError (one line) when it is not such a
    file, or none can be written there."""

    kind = "file"

    def __init__(self, path: str) -> None:
        self.path = path
        self.records: dict[str, KeyRecord] = {}
        self.used: dict[str, int] = {}
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
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as e:
            raise ValueError(
                f"keys file {path} cannot be read ({e}); fix or move it away (its keys stop working)"
            ) from None

    async def _save(self) -> None:
        keys = {i: r.doc() for i, r in self.records.items()}  # NOTE: on the loop, so it is consistent; written off it
        doc = {"format": FORMAT, "keys": keys, "used": dict(self.used)}
        async with self._writing:
            await asyncio.to_thread(write, self.path, doc)

    async def load(self, held: list[KeyRecord]) -> list[KeyRecord] | None:
        if self._loaded:
            return None  # NOTE: one process writes this file: what it holds is what the file holds
        self._loaded = True
        return list(self.records.values())

    async def create(self, rec: KeyRecord) -> None:
        self.records[rec.id] = rec
        try:
            await self._save()
        except OSError:
            del self.records[rec.id]
            raise

    async def revoke(self, key_id: str) -> bool:
        rec = self.records.pop(key_id, None)
        if rec is None:
            return False
        self.used.pop(key_id, None)
        await self._save()
        return True

    async def flush(self, used: dict[str, int]) -> None:
        for i, s in used.items():
            if i in self.records and s > self.used.get(i, 0):
                self.used[i] = s
        await self._save()

    async def last_used(self) -> dict[str, int]:
        return dict(self.used)


# KEYS: the records' hash, the version, the last uses; ARGV: the id. 1: revoked, 0: no such key
REVOKE_LUA = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('INCR', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
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
    and revoke increments (`PREFIX:keys:v`: a replica re-reads the hash when it moved), and a sorted set of the last
    uses (`PREFIX:keys:used`, ID -> unix second, only ever raised: `ZADD GT`)."""

    kind = "redis"

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.hash, self.version_key, self.used_key = f"{prefix}:keys", f"{prefix}:keys:v", f"{prefix}:keys:used"
        self.version: bytes | None = None  # as last read
        self._revoke = client.register_script(REVOKE_LUA)
        self._flush = client.register_script(FLUSH_LUA)

    async def load(self, held: list[KeyRecord]) -> list[KeyRecord] | None:
        version = await self.client.get(self.version_key)
        if version is None and held:
            # NOTE: Redis lost its data (restarted without persistence): the keys this replica holds are written back
            log.warning("the shared state lost the keys made through the API: %d written back", len(held))
            async with self.client.pipeline(transaction=True) as pipe:
                for rec in held:
                    pipe.hsetnx(self.hash, rec.id, json.dumps(rec.doc()))
                pipe.incr(self.version_key)
                await pipe.execute()
            return None
        if version == self.version:
            return None
        raw = await self.client.hgetall(self.hash)
        self.version = version
        out = []
        for key_id, doc in raw.items():
            try:
                out.append(KeyRecord.read(json.loads(doc)))
            except ValueError as e:  # NOTE: one bad record costs that key, not the others
                log.error("key record %r in %s skipped: %s", key_id, self.hash, e)
        return out

    async def create(self, rec: KeyRecord) -> None:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(self.hash, rec.id, json.dumps(rec.doc()))
            pipe.incr(self.version_key)
            await pipe.execute()

    async def revoke(self, key_id: str) -> bool:
        return bool(await self._revoke(keys=[self.hash, self.version_key, self.used_key], args=[key_id]))

    async def flush(self, used: dict[str, int]) -> None:
        if used:
            await self._flush(keys=[self.hash, self.used_key], args=[v for pair in used.items() for v in pair])

    async def last_used(self) -> dict[str, int]:
        got = await self.client.zrange(self.used_key, 0, -1, withscores=True)
        return {(i.decode() if isinstance(i, bytes) else i): int(s) for i, s in got}
