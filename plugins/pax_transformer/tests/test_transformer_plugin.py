"""The plugin loads, registers nothing (a layer is not a model: its users' models are), and its
entry module stays free of JAX."""

from __future__ import annotations

import subprocess
import sys

import pax_transformer.plugin
from pax_core.testing import isolated_host


def test_the_plugin_is_active_and_registers_no_model() -> None:
    host = isolated_host(("transformer", pax_transformer.plugin))
    assert host.records["transformer"].status == "active"
    assert [e.plugin for e in host.components("models")] == ["core"]


def test_plugin_module_does_not_import_jax() -> None:
    code = "import sys, pax_transformer.plugin; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
