"""A fair OpenAI-compatible gateway: the core's policies (VTC by default) in front of OpenAI-compatible servers.

`create_app` is imported lazily, so `fairserve.gateway.cli` (and the main CLI's parser) loads no web stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..tenancy import TenantConfig
from .settings.backends import BackendConfig
from .settings.config import GatewayConfig, build_config, load_config

if TYPE_CHECKING:
    from .http.app import create_app

__all__ = ["create_app", "GatewayConfig", "BackendConfig", "TenantConfig", "build_config", "load_config"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .http.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
