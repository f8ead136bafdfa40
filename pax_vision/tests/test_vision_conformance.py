"""pax-vision passes the conformance suite every plugin runs (the ImageNet models are planned in
test_vision_cli.py, as a user runs `pax plan`)."""

import pytest

from pax_core.testing import PluginConformance
from pax_vision.experiments.base import IdxData, ImagenetData


class TestConformance(PluginConformance):
    plugin = "vision"
    plan_experiments = ("TinyDigitsForTests",)
    trained_experiment = "TinyDigitsForTests"

    @pytest.fixture
    def data_settings(self, host, experiment, request) -> list[str]:
        # Fashion-MNIST and ImageNet are not on a test machine: their experiments read
        # stand-ins in the same formats, in batches a few records fill (the input reads
        # batches ahead in threads, so a check costs tens of batches: at the experiments'
        # 128 to 1,024 images, seconds to tens of seconds on two cores) and without
        # ImageNet's 16 worker processes (whose batches test_vision_inputs.py checks against
        # this process's).
        experiment_class = host.components("experiments").get(f"vision/{experiment}").load()
        if issubclass(experiment_class, IdxData):
            return [f"DATA_DIR='{request.getfixturevalue('fashion_mnist_standin')}'",
                    "BATCH_SIZE=64"]
        if issubclass(experiment_class, ImagenetData):
            return [f"IMAGENET_DIR='{request.getfixturevalue('imagenet_standin')}'",
                    "BATCH_SIZE=8", "INPUT_WORKERS=0"]
        return []
