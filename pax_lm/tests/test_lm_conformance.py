"""pax-lm passes the conformance suite every plugin runs.

Its experiments are checked on a sample of the catalogue that covers each family and input (the
whole catalogue resolves and plans in test_catalogue.py and test_plan.py).
"""

from pax_core.testing import PluginConformance


class TestConformance(PluginConformance):
    plugin = "lm"
    experiments = ("TinyLmForTests", "QuickStartLm", "LmCloudSpmdTest", "LmCloudSpmd2B",
                   "LmCloudTransformerAdam", "C4Spmd1BAdam4Replicas", "LmCloudSpmdPipeline9B")
    plan_experiments = ("TinyLmForTests", "LmCloudSpmdTest")
    trained_experiment = "TinyLmForTests"
