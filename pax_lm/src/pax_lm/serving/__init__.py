"""Serving a language model over HTTP with OpenAI's API (``pax serve``).

``service.py`` runs the decoding engine's continuous batching in a thread of its own, with a
bounded queue and draining; ``protocol.py`` reads OpenAI's request bodies and writes its
responses and server-sent events; ``app.py`` is the FastAPI app over both. FastAPI and uvicorn
are the ``serve`` extra of pax-lm (``pip install 'pax-lm[serve]'``).
"""

from pax_lm.serving.app import ServedModel, create_app
from pax_lm.serving.service import Busy, DecodeService, ShuttingDown, Stream, warm_up

__all__ = ["Busy", "DecodeService", "ServedModel", "ShuttingDown", "Stream", "create_app",
           "warm_up"]
