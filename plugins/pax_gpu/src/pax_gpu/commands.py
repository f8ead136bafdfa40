"""``pax gpu check``: the first thing to run on a GPU machine. It runs the gpu backend's device
check, then compares its cuDNN attention and the FP8 matmul against references on the first
GPU (``pax_gpu.numerics``), prints one table, and exits 0 when every row passes, 1 when one
fails, 2 when no GPU is visible (or the GPU is one Pax refuses).

pax-gpu registers it through ``pax_register_commands``.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Any

import typer

from pax_core import UsageError

app = typer.Typer(help="NVIDIA GPUs: check what the gpu backend runs on this machine.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None)

PLATFORMS = ("gpu", "cpu")
_STYLE = {"pass": "green", "FAIL": "bold red", "skipped": "yellow"}


@app.callback()
def gpu() -> None:
    """NVIDIA GPUs: check what the gpu backend runs on this machine."""


def gpu_devices() -> list[Any]:
    """The GPUs JAX sees; ``UsageError`` (one line) naming what to install when there are none.

    JAX's own warning about a missing CUDA jaxlib is silenced here: the line says it instead.
    """
    import jax

    logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)
    try:
        return jax.devices("gpu")
    except RuntimeError:
        platforms = ", ".join(sorted({d.platform for d in jax.devices()}))
        raise UsageError(f"no GPU is visible to JAX here (it has: {platforms}); on a machine "
                         f"with NVIDIA GPUs install the CUDA jaxlib: pip install "
                         f"\"pax-gpu[cuda12]\"") from None


def describe(device: Any, count: int) -> str:
    """The device the rows were computed on, as the table's title says it."""
    import jax
    import jaxlib

    versions = f"jax {jax.__version__}, jaxlib {jaxlib.__version__}"
    if device.platform == "gpu":
        return (f"GPU {device.id} of {count}: {device.device_kind}, compute capability "
                f"{device.compute_capability}; {versions}")
    return (f"{device.platform} device {device.id} of {count} (not a GPU: cuDNN's rows are "
            f"skipped, XLA emulates FP8); {versions}")


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def show(rows: list[Any], title: str) -> None:
    """The table, then one line of totals."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), title_justify="left")
    for column in ("check", "shape", "dtype", "max abs error", "relative error", "tolerance",
                   "result", "note"):
        justify = "right" if "error" in column or column == "tolerance" else "left"
        table.add_column(column, justify=justify)
    for r in rows:
        style = _STYLE.get(r.status, "")
        table.add_row(escape(r.check), escape(r.shape), escape(r.dtype), _number(r.max_abs),
                      _number(r.relative), _number(r.tolerance),
                      f"[{style}]{escape(r.status)}[/{style}]", escape(r.note))
    # A terminal's own width; written to a file or a pipe, wide enough for one line a row.
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    failed = sum(r.status == "FAIL" for r in rows)
    skipped = sum(r.status == "skipped" for r in rows)
    ran = len(rows) - skipped
    console.print(f"{failed} of {ran} checks failed ({skipped} skipped)" if failed else
                  f"all {ran} checks passed ({skipped} skipped)", highlight=False)


@app.command()
def check(
    tolerance_scale: Annotated[float, typer.Option(
        "--tolerance-scale", metavar="X",
        help="Multiply every tolerance by X (above 0): below 1 to see how close to its limit "
        "each row is, above 1 to accept a kernel known to be coarser.")] = 1.0,
    platform: Annotated[str, typer.Option(
        "--platform", metavar="gpu|cpu",
        help="gpu (the check); cpu runs the same comparisons on the CPU, cuDNN's rows skipped "
        "and FP8 emulated by XLA, to see the check itself work.")] = "gpu",
) -> None:
    """Compare cuDNN attention (forward and gradients, bfloat16 and float16, causal, packed
    and grouped-query shapes) and the FP8 matmul (delayed scaling, forward and gradients)
    against references on the first GPU; exit 0 when all pass, 1 when any fails."""
    if not tolerance_scale > 0:
        raise UsageError(f"--tolerance-scale must be above 0, got {tolerance_scale}")
    if platform not in PLATFORMS:
        raise UsageError(f"--platform must be gpu or cpu, got '{platform}'")
    if platform == "gpu":
        from pax_gpu.backends import GpuBackend

        devices = gpu_devices()
        GpuBackend().check(devices)
    else:
        import jax

        devices = jax.devices("cpu")
    from pax_gpu import numerics

    rows = numerics.run_checks(devices[0], tolerance_scale)
    show(rows, describe(devices[0], len(devices)))
    raise typer.Exit(numerics.exit_code(rows))
