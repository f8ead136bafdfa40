"""Constants an experiment leaves to the devices: ``auto``, resolved when a run trains to the
first of the experiment's candidates whose compiled train step fits a device's memory.

Why by compiling: what a step holds at its peak (the activations its rematerialisation keeps,
the temporaries the compiler plans) is known exactly only to the backend's compiler, for this
mesh, batch and model; a formula would be wrong on the next model. An experiment offers the
choices with ``auto_choices()`` (``{constant: candidates}``, most memory first: the LM
experiments' ``CHECKPOINT_POLICY`` from no rematerialisation to all of it), and the first that
fits is found by bisection (the candidates' memory falling along the list), compiling about
log2(n) of them. A candidate fits when its compilation does not run out of memory and its peak
by the compiler's memory analysis (``pax_core.run.memory_use.planned_peak_bytes``) fits the
smallest device's limit, and the compiler did not have to rematerialise any of it on its own to
get there (XLA does so on a TPU or a GPU near the memory limit, naming what it recomputes
``NAME.remat``): on a v5e chip the 470M benchmark saving the attention's projections too fitted
at 15.3 of 15.7 GiB by the compiler's recomputation, executing 60.6 TFLOP a step where saving
less executed 52.4 and trained 11 % faster. A candidate that fits only so is taken only when
none fits without.
The compiled step of the one chosen is the run's first: nothing compiles twice.

On devices that report no memory limit (the host CPU) nothing is tried: the constant stays
``auto``, which the experiment reads as its own default.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax

from pax_core.config.resolve import ChosenExperiment, configure
from pax_core.errors import UsageError
from pax_core.plugins.host import PluginHost
from pax_core.run.build import Run, build_run
from pax_core.run.memory_use import GIB, device_memory_limit, planned_peak_bytes

AUTO = "auto"


def auto_constants(experiment: Any) -> dict[str, Sequence[Any]]:
    """The experiment's constants that are ``auto``, with their candidates."""
    offered = getattr(experiment, "auto_choices", None)
    return {name: candidates for name, candidates in (offered() if offered else {}).items()
            if getattr(experiment, name) == AUTO}


def build_fitted_run(host: PluginHost, chosen: ChosenExperiment, config_file: str | None,
                     devices: list[jax.Device], read_data: bool = True) -> Run:
    """``build_run`` of ``chosen``, its ``auto`` constants resolved to the devices' memory
    (``Run.fitted`` says what was chosen and why)."""
    auto = auto_constants(chosen.experiment)
    limit = device_memory_limit(devices)
    if not auto or limit is None:
        return build_run(host, configure(chosen, config_file), devices, read_data=read_data)
    run = None
    for name, candidates in auto.items():
        run = _fit(host, chosen, config_file, devices, read_data, name, list(candidates), limit)
    assert run is not None
    return run


def _fit(host: PluginHost, chosen: ChosenExperiment, config_file: str | None,
         devices: list[jax.Device], read_data: bool, name: str, candidates: list[Any],
         limit: int) -> Run:
    # index: (run if it fits, compiled step, why, whether it fits without the compiler's own
    # rematerialisation)
    tried: dict[int, tuple[Run | None, Any, str, bool]] = {}

    def attempt(index: int) -> None:
        setattr(chosen.experiment, name, candidates[index])
        run = build_run(host, configure(chosen, config_file), devices, read_data=read_data)
        try:
            compiled = run.compile_train_step()
        except Exception as e:  # the compiler's own verdict
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            tried[index] = (None, None, "out of memory compiling", False)
            return
        needed = planned_peak_bytes(compiled, devices[0].platform)
        fits, recomputed = needed <= limit, compiler_rematerialised(compiled)
        why = f"{needed / GIB:.1f} GiB" + (", the compiler recomputing" if recomputed else "")
        tried[index] = (run if fits else None, compiled, why, fits and not recomputed)

    def first(clean: bool) -> int:
        """The first candidate that fits (without the compiler's recomputation, if
        ``clean``), found by bisection; len(candidates) if none does."""
        low, high = 0, len(candidates)  # the first fitting index lies in [low, high]
        while low < high:
            middle = (low + high) // 2
            if middle not in tried:
                attempt(middle)
            if (tried[middle][3] if clean else tried[middle][0] is not None):
                high = middle
            else:
                low = middle + 1
        return low

    low = first(clean=True)
    if low == len(candidates):  # none fits without: the first that fits with
        low = first(clean=False)
    said = "; ".join(f"{candidates[i]} {tried[i][2]}" for i in sorted(tried))
    if low == len(candidates):
        setattr(chosen.experiment, name, AUTO)
        raise UsageError(f"{name}=auto: no choice fits a device's {limit / GIB:.1f} GiB "
                         f"({said}); lower PERCORE_BATCH_SIZE, or spread the model over more "
                         f"devices (ICI_MESH_SHAPE)")
    run, compiled, _, _ = tried[low]
    assert run is not None
    setattr(chosen.experiment, name, candidates[low])
    run.first_step = compiled
    run.fitted.append(f"{name}=auto chose {candidates[low]} for {limit / GIB:.1f} GiB a "
                      f"device (tried {said})")
    return run


# An instruction XLA's rematerialisation made, as its HLO text defines it: ``%NAME.remat = ``
# (``.remat2`` and on for a second copy); never a name in an op's metadata, which is quoted.
_COMPILER_REMAT = re.compile(r"\.remat\d* = ")


def compiler_rematerialised(compiled: Any) -> bool:
    """Whether the compiler recomputed part of ``compiled`` on its own to fit the memory (its
    HLO defines instructions XLA's rematerialisation named ``NAME.remat``)."""
    try:
        text = compiled.as_text()
    except Exception:  # a backend without HLO text: nothing known to be recomputed
        return False
    return _COMPILER_REMAT.search(text) is not None
