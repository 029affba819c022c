"""Model access (`models = [...]` on a tenant or a group, `ServerConfig.allowed_models`): the one check the gateway
and `fairserve serve` share, and its 403 message, which names what the tenant may use."""

from __future__ import annotations


def model_refused(allowed_models: dict[str, frozenset[str]], tenant: str, model: str | None) -> str | None:
    """Why `tenant` may not use `model` (the 403's message), or None if it may."""
    allowed = allowed_models.get(tenant)
    if allowed is None or model in allowed:
        return None
    return f"tenant {tenant!r} may not use the model {model!r}; it may use: {', '.join(sorted(allowed)) or 'no model'}"
