"""Per-platform runtime set-up: what must happen before JAX starts, and checks after."""

from __future__ import annotations

from typing import Any


class Backend:
    """Base of a platform's set-up; both steps do nothing unless a platform needs them."""

    platform = ""
    # Whether the train step reuses the old state's buffers for the new one. Accelerators need
    # it: their memory is what limits a model.
    donates_train_state = True

    def prepare(self) -> None:
        """Runs before JAX initialises its runtime: environment variables, XLA flags."""

    def check(self, devices: list[Any]) -> None:
        """Runs once the devices are known; raise ``UsageError`` for unusable ones."""
