"""The plugin registers the model lazily."""

from __future__ import annotations

import subprocess
import sys

import pax_transformer.plugin
from pax_core.testing import isolated_host
from pax_transformer.models import TransformerLm


def test_plugin_registers_transformer_lm() -> None:
    host = isolated_host(("transformer", pax_transformer.plugin))
    assert host.records["transformer"].status == "active"
    entry = host.components("models").get("transformer_lm")
    assert entry.plugin == "transformer"
    assert entry.load() is TransformerLm
    assert entry.build(num_layers=1).num_layers == 1


def test_plugin_module_does_not_import_jax() -> None:
    code = "import sys, pax_transformer.plugin; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
