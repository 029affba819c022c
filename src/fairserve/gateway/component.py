"""How a part of the gateway takes its configuration. A live reload is two phases over every part, as Kubernetes'
API Priority and Fairness applies configuration: every part `check`s the new configuration (and may refuse it),
then every part `configure`s itself from it. Nothing outside a part sets its attributes or copies the
configuration onto it; the keys only a restart applies are refused before either (`config.RESTART`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .config import GatewayConfig


class ReloadError(ValueError):
    """The new configuration was refused (one line); the running one is kept."""


class Configured(Protocol):
    def check(self, old: GatewayConfig, new: GatewayConfig) -> None:
        """ReloadError (one line) if this part cannot apply `new` live."""

    def configure(self, cfg: GatewayConfig) -> None:
        """Take `cfg`'s settings, from the next request, connection, check or scrape on."""
