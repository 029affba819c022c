"""Tenancy, shared by every server in front of a ledger (`fairserve gateway`, `fairserve serve`): tenant config
(`config`), its flags (`flags`) and what requests read of it (`index`), API keys and Bearer auth (`auth`), the admin
API with the live dashboard (`admin`), and the per-tenant Prometheus collector (`metrics`).

The admin API and the collector read the ledger's `view()` and change it through `set_weight` / `reset`, whatever
owns the ledger (the gateway's scheduler, an engine's queue): see `Accounts`.
"""

from .access import model_refused
from .admin import MAX_OWNER_KEYS, Accounts, admin_denied, admin_router
from .auth import AuthThrottle, bearer, metrics_denied, same_key, scope_bearer
from .config import MAX_COST, GroupConfig, QuotaConfig, RateConfig, ServerConfig, TenantConfig, check_tenants
from .flags import parse_tenant, tenants_from_flags
from .index import KeyOwners, key_digest
from .metrics import JAIN_HELP, METRICS_WINDOW_S, SPREAD_HELP, TENANT_FAMILIES, TenantActivity, TenantCollector
from .priority import priority_message, refused_priority

__all__ = [
    "MAX_COST",
    "MAX_OWNER_KEYS",
    "TENANT_FAMILIES",
    "JAIN_HELP",
    "METRICS_WINDOW_S",
    "SPREAD_HELP",
    "Accounts",
    "AuthThrottle",
    "TenantActivity",
    "TenantCollector",
    "GroupConfig",
    "KeyOwners",
    "QuotaConfig",
    "RateConfig",
    "ServerConfig",
    "TenantConfig",
    "admin_denied",
    "admin_router",
    "bearer",
    "check_tenants",
    "key_digest",
    "metrics_denied",
    "parse_tenant",
    "priority_message",
    "refused_priority",
    "same_key",
    "scope_bearer",
    "model_refused",
    "tenants_from_flags",
]
