"""Pax core: the plugin host, the `pax` command and the training loop.

Importing this package is cheap on purpose (no JAX): the command line lists plugins and prints
help without starting an accelerator runtime.
"""

from pax_core.plugins.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["__version__", "hookimpl"]
