"""The gpu backend's presets: what NVIDIA documents for training with JAX on its GPUs
(JAX-Toolbox's "Tips for High-Performance LLMs with JAX and XLA" and JAX's GPU performance
tips), grouped so that each can be turned off by name (``PAX_NO_PRESETS=gpu.nccl``).

Left to XLA on purpose, each for the reason the package's README gives with XLA's values: the
collective combine thresholds (the best one depends on model, mesh and interconnect, and a
large one delays transfers), command buffers (XLA's default set), loop double buffering (XLA
already unrolls by two the loops that hold collectives), and PGLE (the train step is compiled
ahead of time, which JAX's automatic PGLE never profiles)."""

from __future__ import annotations

from pax_core import Preset

PRESETS = [
    # Collectives moved away from the compute that waits for them, so that they overlap (off
    # by default in XLA).
    Preset("latency-hiding", "the latency-hiding scheduler: collectives overlap compute",
           flags={"--xla_gpu_enable_latency_hiding_scheduler": "true"}),
    # The FSDP gathers and gradient all-reduces of a scanned layer issued during the layer
    # before (reduce-scatters already are, by XLA's default).
    Preset("pipelined-collectives", "a scanned layer's gathers and reductions issued early",
           flags={"--xla_gpu_enable_pipelined_all_gather": "true",
                  "--xla_gpu_enable_pipelined_all_reduce": "true"}),
    # XLA preallocates this share of each GPU; the rest is left to cuDNN, cuBLAS and NCCL.
    Preset("memory", "90% of each GPU preallocated for XLA",
           env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}),
    # One hardware queue, so communication kernels run in the order the scheduler chose
    # (before Blackwell; NVIDIA advises against it from compute capability 10).
    Preset("connections", "one CUDA work queue, so collectives keep their scheduled order",
           env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
    # Pax runs one process per host driving all its GPUs; NCCL launches their kernels as one
    # group, which NVIDIA documents against hangs in that arrangement.
    Preset("nccl", "NCCL kernels launched as a group (one process, several GPUs)",
           env={"NCCL_LAUNCH_MODE": "GROUP"}),
]
