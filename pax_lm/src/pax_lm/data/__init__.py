"""Prepared datasets: reading sources, writing and reading token shards (``pax data``)."""
