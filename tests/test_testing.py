"""`pax_core.testing`, the kit plugin authors use: fixtures, throwaway plugins, fake meshes."""

from __future__ import annotations

import jax
import pytest

from pax_core import hookimpl
from pax_core.plugins.records import Component
from pax_core.testing import cpu_mesh, register_plugin


def test_pax_host_fixture_has_only_the_builtins(pax_host):
    assert list(pax_host.records) == ["core"]
    assert pax_host.components("partitioners").names() == ["core/data_parallel", "core/spmd"]


def test_throwaway_plugin_is_registered_for_one_block(pax_host):
    class Extra:
        @hookimpl
        def pax_register_models(self):
            return [Component("extra", "pax_core.models.mlp:MlpClassifier")]

    with register_plugin(pax_host, Extra(), "extra") as record:
        assert record.registered == {"models": ["extra"]}
        model = pax_host.components("models").get("extra").build(num_classes=3)
        assert model.num_classes == 3
    assert "extra" not in pax_host.records


def test_cpu_mesh_uses_the_fake_devices():
    assert jax.device_count() == 8
    mesh = cpu_mesh((2, 4), ("data", "mdl"))
    assert dict(mesh.shape) == {"data": 2, "mdl": 4}
    with pytest.raises(RuntimeError, match="need 16 devices"):
        cpu_mesh((4, 4), ("data", "mdl"))
