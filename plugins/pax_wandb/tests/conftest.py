"""Every test sees 8 fake CPU devices: set before anything imports JAX. (The run's cache folder,
compiled programs and the CPU's measured peak, comes from ``pax_core.testing``.)"""

from pax_core.testing import use_cpu_devices

use_cpu_devices(8)
