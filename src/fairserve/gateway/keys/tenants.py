"""Tenants made through the keys API: `POST /admin/keys` with `new_tenant` (its weight, priority, models, quota, rate
caps: a tenant table of the config file without keys) makes the tenant and its first key at once. Such a tenant is
the keys' own: it is kept in the keys' store (so a restart and every replica have it) and goes with its last key
(`DELETE /admin/keys/{id}`).

The configuration a gateway runs is the config file's with these tenants added (`merged`), checked as one (the
file's rules: unique names, a tenant is no group, ...), applied as a reload applies a file (gateway/settings/
reload.py): at start, when the API makes or drops one, when a replica reads that another did, and at each reload of
the file. The file wins: a tenant it names is the file's (its weight, caps and keys), and the API's keys of that name
serve as its keys; a file whose tenants clash with the API's (a tenant `acme` of the API, a file with `acme/x`) is
refused like any invalid file, naming them."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ...api.config import one_line
from ...tenancy import TenantConfig, check_tenants
from .book import Refused

if TYPE_CHECKING:
    from ..settings.config import GatewayConfig

log = logging.getLogger("fairserve.gateway")
TENANT_FIELDS = ("weight", "priority", "priorities", "models", "quota", "rate")  # a tenant table's, less its keys
SHOWN_CLASHES = 3  # the API's tenants named in a refused file's message


def parse_tenant(name: str, doc: Any) -> TenantConfig:
    """The tenant `new_tenant` describes ({} for every default); Refused (400) with the field at fault."""
    if not isinstance(doc, dict):
        msg = 'new_tenant must be an object: {"weight"?: W, "quota"?: {...}, "rate"?: {...}, ...} ({}: defaults)'
        raise Refused(400, "invalid_request", msg, "new_tenant")
    unknown = sorted(set(doc) - set(TENANT_FIELDS))
    if unknown:
        msg = f"new_tenant: unknown field {unknown[0]!r} (it takes {', '.join(TENANT_FIELDS)})"
        raise Refused(400, "invalid_request", msg, "new_tenant")
    try:
        return TenantConfig.model_validate({**doc, "name": name, "api_keys": []})
    except ValidationError as e:
        msg = one_line(e).replace("config key '", "new_tenant: '").replace("config: ", "new_tenant: ")
        raise Refused(400, "invalid_request", msg, "new_tenant") from None


def tenant_doc(t: TenantConfig) -> dict[str, Any]:
    """What the store keeps of a tenant the API made (read back by `read_tenant`)."""
    return t.model_dump(mode="json", include={"name", *TENANT_FIELDS}, exclude_defaults=True)


def read_tenant(doc: Any) -> TenantConfig:
    """A stored tenant; ValueError (one line) for anything else."""
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str) or set(doc) - {"name", *TENANT_FIELDS}:
        raise ValueError(f"not a tenant record: {str(doc)[:200]}")
    try:
        return TenantConfig.model_validate({**doc, "api_keys": []})
    except ValidationError as e:
        raise ValueError(f"tenant record {doc['name']!r}: {one_line(e)}") from None


def at_start(base: GatewayConfig, made: list[TenantConfig]) -> GatewayConfig:
    """`merged` for a gateway's start: where the file clashes with the API's tenants, said (one line) and the file's
    alone (their keys are refused, listed `orphaned`, until a reload of a mended file or their revocation)."""
    try:
        return merged(base, made)
    except ValueError as e:
        log.error("the tenants made through the keys API are not applied: %s", e)
        return base


def merged(base: GatewayConfig, made: list[TenantConfig]) -> GatewayConfig:
    """`base` (the config file's) with the API's tenants it does not name; ValueError (one line) when they clash.
    O(tenants): a reload runs it off the event loop. `base` itself when there is nothing to add, or no key is asked
    (keyless: the API makes no key then)."""
    if base.keyless or not made:
        return base
    names = base.index().name_set
    extra = [t for t in made if t.name not in names]
    if not extra:
        return base
    out = base.model_copy(update={"tenants": [*base.tenants, *extra]})
    try:
        check_tenants(out.tenants, out.admin_key, out.groups)
    except ValueError as e:
        shown = ", ".join(repr(t.name) for t in extra[:SHOWN_CLASHES])
        more = f" and {len(extra) - SHOWN_CLASHES} more" if len(extra) > SHOWN_CLASHES else ""
        raise ValueError(f"{e} (with the tenants made through the keys API: {shown}{more})") from None
    return out
