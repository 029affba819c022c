"""The weights a fairserve gateway (or `fairserve serve`) gives each tenant, read from its admin API, as weights of
the bench's clients: a client's tenant is the owner of its API key (`POST /admin/owners`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import httpx


@dataclass(frozen=True, slots=True)
class ServerWeights:
    weights: dict[str, float]  # client -> its tenant's weight
    tenant_of: dict[str, str]  # client -> tenant

    def describe(self) -> str:
        return ", ".join(f"{c}={w:g} ({self.tenant_of[c]})" for c, w in sorted(self.weights.items()))


def server_weights(target: str, admin_key: str, key_of: Mapping[str, str], timeout_s: float = 10.0) -> ServerWeights:
    """`key_of`: client -> API key. ValueError (one line) when the server cannot be read or does not know a key."""
    base = target.strip().rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {admin_key}"}
    try:
        with httpx.Client(timeout=timeout_s, headers=headers) as client:
            tenants = _json(client.get(base + "/admin/tenants"), base)
            owners = _json(client.post(base + "/admin/owners", json={"keys": sorted(set(key_of.values()))}), base)
    except httpx.HTTPError as e:
        raise ValueError(f"--admin-key: cannot read the weights from {base}: {e}") from None
    weight = {t["name"]: float(t["weight"]) for t in tenants["tenants"]}
    tenant_of: dict[str, str] = {}
    for name, key in sorted(key_of.items()):
        owner = owners["owners"].get(key)
        if owner is None or owner not in weight:
            raise ValueError(f"--admin-key: {base} knows no tenant with the API key of client {name!r}")
        tenant_of[name] = owner
    return ServerWeights({c: weight[t] for c, t in tenant_of.items()}, tenant_of)


def _json(r: httpx.Response, base: str) -> dict:
    if r.status_code != 200:
        try:
            why = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            why = f"HTTP {r.status_code}"
        raise ValueError(f"--admin-key: {base} refused {r.request.method} {r.request.url.path}: {why}")
    return r.json()
