"""Hugging Face model folders: the ``hf`` weight format (``pax import hf``, ``pax export
--format hf``): the families' configurations, the tensors' names and layouts, safetensors files."""
