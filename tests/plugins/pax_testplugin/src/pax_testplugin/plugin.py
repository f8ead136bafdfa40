"""Entry point of the test plugin: registrations only, nothing heavy imported."""

from pax_core import Component, ExperimentRef, hookimpl

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.0,<2"


@hookimpl
def pax_register_models():
    return [Component("tiny_lm", "pax_testplugin.models:TinyLm", "one-layer next-token model")]


@hookimpl
def pax_register_inputs():
    return [Component("counting", "pax_testplugin.inputs:CountingInput", "arithmetic sequences")]


@hookimpl
def pax_register_commands():
    return [Component("counting-sample", "pax_testplugin.commands:sample",
                      "print rows of the input")]


@hookimpl
def pax_register_experiments():
    return [
        ExperimentRef(
            "TinyCounting",
            "pax_testplugin.experiments:TinyCounting",
            "tiny LM learns to count (seconds on a CPU)",
            aliases=("tasks.test.params.counting.TinyCountingLegacy",),
        )
    ]
