"""Every test sees 8 fake CPU devices: set before anything imports JAX. The measured CPU peak
is cached in a temporary directory, not the user's."""

import os
import tempfile

from pax_core.testing import use_cpu_devices

use_cpu_devices(8)
os.environ["PAX_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), "pax-test-cache")
