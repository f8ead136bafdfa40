"""The built-in components, registered as the plugin ``core``.

They go through the same hooks as any plugin, so a plugin can do everything the core does and
``pax plugins`` lists the built-ins like the rest.
"""

from pax_core.plugins.hookspecs import hookimpl
from pax_core.plugins.records import Component, ExperimentRef

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.0,<2"


@hookimpl
def pax_register_models():
    return [Component("mlp", "pax_core.models.mlp:MlpClassifier", "dense classifier (ReLU MLP)")]


@hookimpl
def pax_register_partitioners():
    return [
        Component(
            "data_parallel",
            "pax_core.parallel.data_parallel:DataParallel",
            "Pax's pmap path: parameters replicated, batch split, gradients averaged",
        ),
        Component(
            "spmd",
            "pax_core.parallel.spmd:Spmd",
            "sharding by logical axis rules over the experiment's ICI x DCN mesh",
        ),
    ]


@hookimpl
def pax_register_inputs():
    return [
        Component(
            "synthetic",
            "pax_core.inputs.synthetic:SyntheticInput",
            "random tokens or features from a seed (no data needed)",
        )
    ]


@hookimpl
def pax_register_checkpointers():
    return [
        Component(
            "orbax",
            "pax_core.checkpointers.orbax:OrbaxCheckpointer",
            "Orbax CheckpointManager: async, atomic, keeps the last N",
        )
    ]


@hookimpl
def pax_register_loggers():
    return [
        Component("console", "pax_core.loggers.console:ConsoleLogger", "progress bar or lines"),
        Component("jsonl", "pax_core.loggers.jsonl:JsonlLogger", "JOB_DIR/metrics.jsonl"),
        Component(
            "tensorboard",
            "pax_core.loggers.tensorboard:TensorBoardLogger",
            "event files under JOB_DIR/summaries (no TensorFlow)",
        ),
    ]


@hookimpl
def pax_register_experiments():
    return [
        ExperimentRef(
            "MlpSynthetic",
            "pax_core.examples:MlpSynthetic",
            "tiny MLP on synthetic features: checks an installation in seconds",
        )
    ]


@hookimpl
def pax_register_backends():
    return [Component("cpu", "pax_core.backends.cpu:CpuBackend",
                      "host CPU (fake devices for tests)"),
            Component("tpu", "pax_core.backends.tpu:TpuBackend",
                      "Cloud TPU: Pax's LIBTPU_INIT_ARGS (install pax-core[tpu])")]


@hookimpl
def pax_register_mesh_layouts():
    return [Component("contiguous", "pax_core.parallel.layouts:MeshLayout",
                      "devices in JAX's order, consecutive ones forming a slice")]

