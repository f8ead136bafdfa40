"""Input pipelines. ``base.Input`` is the interface; ``synthetic`` needs no data."""

from pax_core.inputs.base import Input

__all__ = ["Input"]
