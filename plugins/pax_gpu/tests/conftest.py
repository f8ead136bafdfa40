"""Every test sees 8 fake CPU devices: set before anything imports JAX."""

from pax_core.testing import use_cpu_devices

use_cpu_devices(8)
