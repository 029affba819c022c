"""The keys made through the API, wired into the gateway (a part: gateway/component.py). The book answers the request
path (`KeyOwners.more`: asked after the config file's keys); the store keeps the keys across restarts: with `state`
in Redis, shared by the replicas, else in `SNAPSHOT.keys` beside the snapshot file; with neither, no key is made
(409: a key that a restart silently drops would lock its client out).

Replicas: a create or revoke is written to Redis and applied on the replica that took it at once; every replica
polls the store's version every `POLL_S` and re-reads the records when it moved, so a revoked key is refused
everywhere within `POLL_S` (plus one round trip); a replica asked for a key it does not know reads the store once
before its 401 (`recheck`), so a new key serves at once everywhere. Last use: noted per second in the process,
flushed to the store every `POLL_S` with Redis, with the snapshot to the file (every `snapshot_interval_s`), and at
stop. While Redis cannot be
reached each replica keeps serving the keys it last read (one warning), and creating or revoking one answers 503.

A reload keeps every key made through the API (it replaces the config file's keys only); a key whose tenant a reload
removed is refused (401) and listed `orphaned` until it is revoked, or until a reload brings the tenant back.

Tenants made with a key (`new_tenant`, gateway/keys/tenants.py) are kept in the same store and applied to the gateway
(`Tenancy.use_tenants`: a reload with them added) at start, when this replica makes or drops one, and when a poll
reads that another did."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ...tenancy import QuotaConfig, TenantConfig
from ...tenancy.index import KeyOwners
from ..component import Part, ReloadError, cancelled
from .book import MAX_KEYS, KeyBook, Refused, make, parse_create
from .store import FileKeys, KeyStore, RedisKeys
from .tenants import merged, parse_tenant, tenant_doc

if TYPE_CHECKING:
    from ..settings.config import GatewayConfig
    from ..shared.state import SharedState

log = logging.getLogger("fairserve.gateway")
POLL_S = 0.25  # how often a replica reads the store's version (a revoked key is refused everywhere within this)
NO_STORE = (
    "keys made through the API need a place that outlives a restart: run the gateway with `state` (Redis, shared by "
    "the replicas) or `snapshot` (the keys go to SNAPSHOT.keys beside it)"
)


class Scheduler(Protocol):
    """What the keys ask of the scheduler (gateway/admission/scheduler.py): the shared state it joined; the keys'
    budgets enforced as quotas of their nodes (`key:ID`)."""

    shared: SharedState | None

    def use_budgets(self, budgets: dict[str, QuotaConfig]) -> None: ...


class Tenancy(Protocol):
    """What the keys ask of the gateway (gateway/instance.py): the config file's configuration as last read, and
    the API's tenants put in place (a reload with them added; ReloadError when refused)."""

    base: GatewayConfig

    async def use_tenants(self) -> None: ...


class ApiKeys(Part):
    """The keys made through the API of one gateway (`create`, `rows`, `revoke`; a component)."""

    def __init__(
        self,
        cfg: GatewayConfig,
        sched: Scheduler,
        owners: KeyOwners,
        tenancy: Tenancy | None = None,
        store: FileKeys | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`tenancy`: the gateway the API's tenants are put in place in (None: a part on its own, no tenant made);
        `store`: the keys file beside the snapshot, read by the gateway (its tenants are in `cfg` already)."""
        self.sched = sched
        self.book = KeyBook(clock)
        self.store: KeyStore | None = store
        # the tenants the API made, by name (replaced whole at each change, never changed in place: a reload reads
        # it on its thread)
        self.tenants: dict[str, TenantConfig] = {}
        self.tenancy = tenancy
        if isinstance(self.store, FileKeys):
            self.book.load(self.store.records.values())
            self.tenants = dict(self.store.tenants)
            sched.use_budgets(self.book.budget_quotas())
        self.keyless = cfg.keyless
        self.lost = False  # the store could not be read at the last poll
        self._task: asyncio.Task[None] | None = None
        self._file_every_s = cfg.snapshot_interval_s  # the last uses go to the file with the snapshot (0: at stop)
        # NOTE: one read or write of the store at a time, so that a poll's older read never undoes a create or revoke
        self._io = asyncio.Lock()
        self._polls = 0  # polls begun
        self._applying: asyncio.Event | None = None  # set once the tenants a poll read are in place
        owners.more = self.book.owner
        self.configure(cfg)

    def configure(self, cfg: GatewayConfig) -> None:
        """The tenants the keys may name from now on (a reload): a key of a removed tenant is refused, kept."""
        self.book.tenants = cfg.index().name_set
        self.keyless = cfg.keyless

    async def start(self) -> None:
        """With `state`, the keys are in the shared state's Redis (joined by the scheduler, started first): read
        now, then polled."""
        shared = self.sched.shared
        loop = asyncio.get_running_loop()
        if shared is not None:
            self.store = RedisKeys(shared._client, shared.settings.prefix)
            await self.refresh()
            self._task = loop.create_task(self._run(POLL_S, poll=True))
            return
        if self.store is not None and self._file_every_s > 0:
            self._task = loop.create_task(self._run(self._file_every_s, poll=False))

    async def stop(self) -> None:
        """The polls end; the last uses not yet written are (best effort)."""
        task, self._task = self._task, None
        await cancelled(task)
        if self.store is not None and not await self._flush():
            log.warning("the last uses of the API's keys were not written at stop")

    async def refresh(self) -> None:
        """Re-read the store's records if they changed, unless a poll began after this was asked (and has ended):
        misses at once share one."""
        asked = self._polls
        async with self._io:
            if self._polls != asked:
                return
            self._polls += 1
            changed = await self._poll()
        if changed:  # NOTE: outside the lock: a reload at many tenants takes a while, creates and revokes go on
            self._applying = applying = asyncio.Event()  # NOTE: a key of the new tenants waits for it (`recheck`)
            try:
                await self._use_tenants()
            finally:
                applying.set()
                if self._applying is applying:
                    self._applying = None

    async def recheck(self, key: str | None) -> bool:
        """Before the 401 of a key this replica does not know: with Redis, whether a refresh made it known (a key
        made on another replica serves at once; the auth throttle bounds what unknown keys cost)."""
        if key is None or self._task is None or not isinstance(self.store, RedisKeys):
            return False
        if self.book.knows(key):  # NOTE: refused as it is (expired, orphaned), unless its new tenant is being applied
            if (applying := self._applying) is None:
                return False
            await applying.wait()
        else:
            await self.refresh()
        return self.book.owner(key) is not None

    async def _poll(self) -> bool:
        """Whether the tenants the API made changed. One warning when the store cannot be read, one line when it can
        again."""
        assert self.store is not None
        try:
            loaded = await self.store.load((list(self.book.records.values()), list(self.tenants.values())))
        except Exception as e:  # NOTE: Redis lost: the keys last read keep serving
            if not self.lost:
                log.warning("the keys made through the API cannot be read (%r): the last read serve", e)
                self.lost = True
            return False
        if self.lost:
            log.warning("the keys made through the API are read again")
            self.lost = False
        if loaded is None:
            return False
        records, made = loaded
        self.book.load(records)
        self.sched.use_budgets(self.book.budget_quotas())
        tenants = {t.name: t for t in made}
        if tenants == self.tenants:
            return False
        self.tenants = tenants
        return True

    async def _use_tenants(self) -> None:
        """The API's tenants put in place (a reload of the gateway with them); refused: said once, the running
        configuration kept (the file clashes with them: a reload of a fixed file or a revoke mends it)."""
        if self.tenancy is None:
            return
        try:
            await self.tenancy.use_tenants()
        except ReloadError as e:
            log.error("the tenants made through the keys API are not applied: %s", e)

    async def _run(self, every_s: float, poll: bool) -> None:
        # NOTE: until `stop` takes the task: a cancellation that lands inside a Redis call can be swallowed there,
        # and the loop must still end (else `stop` waits on it forever)
        me = asyncio.current_task()
        while self._task is me:
            await asyncio.sleep(every_s)
            if poll:
                await self.refresh()
            await self._flush()

    async def _flush(self) -> bool:
        """The last uses not yet written, written; kept for the next flush when the store fails (False)."""
        assert self.store is not None
        unsent = self.book.take_unsent()
        if not unsent:
            return True
        try:
            await self.store.flush(unsent)
        except Exception as e:  # NOTE: Redis lost (the poll has warned), or the file not written
            if self.store.kind == "file":
                log.error("the keys file was not written: %r", e)
            for i, second in unsent.items():
                self.book.unsent.setdefault(i, second)
            return False
        return True

    def _writable(self) -> KeyStore:
        if self.keyless:
            raise Refused(409, "keyless", "no tenants are configured (keyless mode): the gateway checks no key")
        if self.store is None:
            raise Refused(409, "no_key_store", NO_STORE)
        return self.store

    async def create(self, body: bytes) -> dict[str, Any]:
        """`POST /admin/keys`: a new key of an existing tenant, or of the tenant it makes (`new_tenant`); the answer
        holds the key, once, when it serves."""
        store = self._writable()
        asked = parse_create(body, self.book.clock())
        tenant = await self._new_tenant(asked.tenant, asked.new_tenant) if asked.new_tenant is not None else None
        if tenant is None and asked.tenant not in self.book.tenants:
            msg = (
                f"no tenant named {asked.tenant!r}: give new_tenant to make it with the key ({{}}: weight 1, no "
                "quota or cap), or add it to the config file (and reload)"
            )
            raise Refused(404, "unknown_tenant", msg, "tenant")
        if len(self.book.records) >= MAX_KEYS:
            raise Refused(409, "too_many_keys", f"the API keeps at most {MAX_KEYS} keys: revoke some first")
        key, rec = make(asked, self.book.clock())
        async with self._io:
            # NOTE: asked again under the lock: a revoke of its last key may have dropped an API-made tenant since
            made_by_api = tenant is None and asked.tenant in self.tenants and asked.tenant not in self._file_tenants()
            if tenant is None and not made_by_api and asked.tenant not in self._file_tenants():
                raise _gone(asked.tenant)
            kept = await self._write(store.create(rec, tenant, made_by_api))
            if kept != 1:
                raise _exists(asked.tenant) if kept == 0 else _gone(asked.tenant)
            self.book.add(rec)
            if rec.budget is not None:
                self.sched.use_budgets(self.book.budget_quotas())
            if tenant is not None:
                self.tenants = {**self.tenants, tenant.name: tenant}
        if tenant is not None:
            try:
                await self.tenancy.use_tenants() if self.tenancy is not None else None
            except ReloadError as e:  # NOTE: a reload of the file in between clashes with it: nothing is kept
                await self.revoke(rec.id)
                raise Refused(409, "invalid_tenant", f"tenant {tenant.name!r} not made: {e}", "new_tenant") from None
            log.info("tenant %r made through the keys API", tenant.name)
        log.info("API key %s (%s...) made for tenant %r", rec.id, rec.prefix, asked.tenant)
        return {"key": key, **self.book.row(rec, 0, self.book.clock())}

    async def _new_tenant(self, name: str, doc: Any) -> TenantConfig:
        """The tenant `new_tenant` makes, checked against the running ones (off the event loop: O(tenants))."""
        if name in self.book.tenants:
            raise _exists(name)
        tenant = parse_tenant(name, doc)
        if self.tenancy is not None:
            try:
                await asyncio.to_thread(merged, self.tenancy.base, [*self.tenants.values(), tenant])
            except ValueError as e:
                raise Refused(409, "invalid_tenant", f"tenant {name!r} not made: {e}", "tenant") from None
        return tenant

    async def revoke(self, key_id: str) -> dict[str, Any]:
        """`DELETE /admin/keys/{id}`: refused here at once, everywhere within `POLL_S`."""
        store = self._writable()
        async with self._io:
            if not await self._write(store.revoke(key_id)):
                raise Refused(404, "unknown_key", f"no key with id {key_id!r} (GET /admin/keys lists them)")
            rec = self.book.remove(key_id)
            if rec is not None and rec.budget is not None:
                self.sched.use_budgets(self.book.budget_quotas())
            gone = rec is not None and rec.tenant in self.tenants and not self._keys_of(rec.tenant)
            if gone:
                assert rec is not None
                self.tenants = {n: t for n, t in self.tenants.items() if n != rec.tenant}
        log.info("API key %s revoked%s", key_id, f" (tenant {rec.tenant!r})" if rec is not None else "")
        if gone:
            assert rec is not None
            await self._use_tenants()
            log.info("tenant %r, made through the keys API, dropped with its last key", rec.tenant)
        return {"id": key_id, "revoked": True}

    def _file_tenants(self) -> frozenset[str] | set[str]:
        """The tenants the config file names (as last read); the running ones without a gateway (a test's part)."""
        return self.tenancy.base.index().name_set if self.tenancy is not None else set(self.book.tenants)

    def _keys_of(self, tenant: str) -> int:
        return sum(r.tenant == tenant for r in self.book.records.values())

    async def _write(self, call: Any) -> Any:
        try:
            return await call
        except Exception as e:  # NOTE: the file (OSError) or Redis (a ConnectionError, a TimeoutError, ...)
            redis = self.store is not None and self.store.kind == "redis"
            where = "the shared state (Redis) did not answer" if redis else "the keys file was not written"
            raise Refused(
                503, "key_store_unavailable", f"{where}: {e!r}; try again (GET /admin/keys lists what is kept)"
            ) from None

    async def all_rows(self) -> dict[str, Any]:
        """`GET /admin/keys` and the dashboard: every key (never the key itself) and where they are kept."""
        try:
            stored = await self.store.last_used() if self.store is not None else {}
        except Exception:  # NOTE: Redis lost: this replica's own last uses
            stored = {}
        counts = Counter(r.tenant for r in self.book.records.values())
        made = [{"weight": t.weight, **tenant_doc(t), "keys": counts[n]} for n, t in sorted(self.tenants.items())]
        return {
            "store": self.store.kind if self.store is not None else None,
            "keys": self.book.rows(stored),
            "tenants": made,
        }

    def refusal(self, key: str | None) -> str | None:
        """The 401's message for a key of the book that is expired or orphaned (the failure path only)."""
        return self.book.refusal(key)


def _exists(name: str) -> Refused:
    msg = f"tenant {name!r} exists: make its key without new_tenant (its weight, quota and caps are where it was made)"
    return Refused(409, "tenant_exists", msg, "new_tenant")


def _gone(name: str) -> Refused:
    msg = f"no tenant named {name!r}: its last key was revoked meanwhile (give new_tenant to make it again)"
    return Refused(404, "unknown_tenant", msg, "tenant")
