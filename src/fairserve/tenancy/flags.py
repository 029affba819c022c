"""The `--tenant PATH:KEY[:WEIGHT]` and `--group PATH:WEIGHT[:PRIORITY]` flags as the config's tenant and group
tables (`ServerConfig`'s `tenants` and `groups` keys read them)."""

from __future__ import annotations

from typing import Any


def parse_tenant(text: str) -> tuple[str, str, float | None]:
    """`PATH:KEY[:WEIGHT]` → (path, key, weight or None)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise ValueError(f"bad --tenant {text!r}: expected PATH:KEY or PATH:KEY:WEIGHT (PATH: a name or org/team/name)")
    weight = None
    if len(parts) == 3:
        try:
            weight = float(parts[2])
        except ValueError:
            raise ValueError(f"bad --tenant {text!r}: weight {parts[2]!r} is not a number") from None
    return parts[0], parts[1], weight


def tenants_from_flags(flags: list[str]) -> list[dict[str, Any]]:
    """Repeating a name adds keys to that tenant (`--tenant a:k1 --tenant a:k2:2`)."""
    tenants: dict[str, dict[str, Any]] = {}
    for text in flags:
        name, api_key, weight = parse_tenant(text)
        t = tenants.setdefault(name, {"name": name, "api_keys": []})
        t["api_keys"].append(api_key)
        if weight is not None:
            t["weight"] = weight
    return list(tenants.values())


def groups_from_flags(flags: list[str]) -> list[dict[str, Any]]:
    """`--group PATH:WEIGHT[:PRIORITY]` → group tables (`pro:4:0`, `pro/acme:2`)."""
    out = []
    for text in flags:
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[0]:
            raise ValueError(f"bad --group {text!r}: expected PATH:WEIGHT or PATH:WEIGHT:PRIORITY")
        group: dict[str, Any] = {"name": parts[0]}
        try:
            group["weight"] = float(parts[1])
        except ValueError:
            raise ValueError(f"bad --group {text!r}: weight {parts[1]!r} is not a number") from None
        if len(parts) == 3:
            try:
                group["priority"] = int(parts[2])
            except ValueError:
                raise ValueError(f"bad --group {text!r}: priority {parts[2]!r} is not an integer") from None
        out.append(group)
    return out
