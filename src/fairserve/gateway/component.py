"""The gateway's parts and their one life cycle. The gateway holds its parts in start order (`Gateway.parts()`):
it starts them in that order, stops them in reverse, and applies a live reload in two phases over all of them, as
Kubernetes' API Priority and Fairness applies configuration: every part `check`s the new configuration (and may
refuse it), then every part `configure`s itself from it. Nothing outside a part sets its attributes or copies the
configuration onto it; the keys only a restart applies are refused before either (`api.keys.reload_keys`)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .settings.config import GatewayConfig


class ReloadError(ValueError):
    """The new configuration was refused (one line); the running one is kept."""


class Component(Protocol):
    def check(self, old: GatewayConfig, new: GatewayConfig) -> None:
        """ReloadError (one line) if this part cannot apply `new` live."""

    def configure(self, cfg: GatewayConfig) -> None:
        """Take `cfg`'s settings, from the next request, connection, check or scrape on."""

    async def start(self) -> None:
        """Begin its own work (tasks, connections), before the first request; the parts before it have started."""

    async def stop(self) -> None:
        """End its work, after the last request; the parts after it have stopped."""


async def cancelled(task: asyncio.Task[None] | None) -> None:
    """A part's own task (a loop that runs until stopped), cancelled and waited for; nothing if there is none."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Part:
    """A component whose steps do nothing until it says otherwise: a part overrides the steps it has."""

    def check(self, old: GatewayConfig, new: GatewayConfig) -> None:
        """Any value of its keys applies live."""

    def configure(self, cfg: GatewayConfig) -> None:
        """It reads no key after it is made."""

    async def start(self) -> None:
        """Nothing to begin."""

    async def stop(self) -> None:
        """Nothing to end."""
