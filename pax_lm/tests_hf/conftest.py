"""Tests against transformers itself (the ``hf`` nox session installs torch and transformers):
every test sees 8 fake CPU devices, set before anything imports JAX."""

from __future__ import annotations

from pax_core.testing import use_cpu_devices

use_cpu_devices(8)
