"""The text of a ``tf.train.Example``, the record TFDS writes (parsed by ``pax_core``)."""

from __future__ import annotations

from pax_core import UsageError, parse_tf_example


def text_feature(record: bytes, field: str, where: str) -> str:
    """The UTF-8 text of bytes feature ``field`` of a serialized Example."""
    features = parse_tf_example(record, where)
    if field not in features:
        raise UsageError(f"{where}: no feature '{field}' (has: {', '.join(sorted(features))}); "
                         f"give --field")
    values = features[field]
    if len(values) != 1 or not isinstance(values[0], bytes):
        raise UsageError(f"{where}: feature '{field}' is not one bytes value")
    return values[0].decode("utf-8", errors="replace")
