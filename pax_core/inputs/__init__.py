"""Input pipelines. ``base.Input`` is the interface; ``indexed.IndexedInput`` the base of
seeded, index-addressed inputs on grain; ``synthetic`` needs no data."""

from pax_core.inputs.base import Input

__all__ = ["Input"]
