"""pax-lm passes the conformance suite every plugin runs.

Its experiments are checked on a sample of the catalogue that covers each family and input (the
whole catalogue resolves and plans in test_catalogue.py and test_plan.py).
"""

import pytest

from pax_core.testing import PluginConformance
from pax_lm.experiments.c4 import C4UnsupervisedDataset


class TestConformance(PluginConformance):
    plugin = "lm"
    experiments = ("TinyLmForTests", "QuickStartLm", "LmCloudSpmdTest", "LmCloudSpmd2B",
                   "LmCloudTransformerAdam", "C4Spmd1BAdam4Replicas", "LmCloudSpmdPipeline9B")
    plan_experiments = ("TinyLmForTests", "LmCloudSpmdTest")
    trained_experiment = "TinyLmForTests"

    @pytest.fixture
    def data_settings(self, host, experiment, request) -> list[str]:
        # C4 is not on a test machine: its experiments read a stand-in in TFDS's c4/en layout,
        # tokenized with a SentencePiece model trained on it, in batches of 4 rows (of 128,
        # validation's few KB would be one batch, with no later batch to come back to) and
        # without the training input's worker process (seconds to start; test_tokens_input.py
        # checks workers' batches and positions against this process's).
        experiment_class = host.components("experiments").get(f"lm/{experiment}").load()
        if issubclass(experiment_class, C4UnsupervisedDataset):
            c4 = request.getfixturevalue("c4_standin")
            return [f"C4_DATA_DIR='{c4['data']}'", f"C4_SPM_MODEL='{c4['model']}'",
                    "PERCORE_BATCH_SIZE=1", "INPUT_WORKERS=0"]
        return []
