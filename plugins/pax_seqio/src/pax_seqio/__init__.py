"""pax-seqio: SeqIO tasks and mixtures as Pax inputs (``SeqIOInput``).

``SeqIOInput`` is the package's public face, imported on first use (PEP 562); the module that
defines it imports TensorFlow and SeqIO only when a run builds the input.
"""

from __future__ import annotations

from pax_core import public_face

__version__ = "0.1.0"

_EXPORTS = {"SeqIOInput": "pax_seqio.inputs"}
__all__ = sorted(["__version__", *_EXPORTS])
__getattr__ = public_face(__name__, _EXPORTS)
