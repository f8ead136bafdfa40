from pax_core.testing import use_cpu_devices

use_cpu_devices(8)
