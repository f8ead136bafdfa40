"""``tf.train.Example``, the record TFDS writes, read and written without TensorFlow.

The message types are built from their definition (TensorFlow's ``example.proto`` and
``feature.proto``: Example → Features → map<string, Feature> → BytesList / FloatList / Int64List)
in a descriptor pool of their own, so they work beside TensorFlow's generated classes.
"""

from __future__ import annotations

import functools
from typing import Any

from pax_core import UsageError


@functools.cache
def _example_class() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="pax_lm/tf_example.proto",
                                              package="tensorflow", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str | None]) -> Any:
        proto = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            added = proto.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                added.type_name = type_name
        return proto

    repeated, optional = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", ("value", 1, F.TYPE_BYTES, repeated, None))
    message("FloatList", ("value", 1, F.TYPE_FLOAT, repeated, None))
    message("Int64List", ("value", 1, F.TYPE_INT64, repeated, None))
    feature = message("Feature",
                      ("bytes_list", 1, F.TYPE_MESSAGE, optional, ".tensorflow.BytesList"),
                      ("float_list", 2, F.TYPE_MESSAGE, optional, ".tensorflow.FloatList"),
                      ("int64_list", 3, F.TYPE_MESSAGE, optional, ".tensorflow.Int64List"))
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    features = message("Features", ("feature", 1, F.TYPE_MESSAGE, repeated,
                                    ".tensorflow.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=optional)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=optional,
                    type_name=".tensorflow.Feature")
    entry.options.map_entry = True
    message("Example", ("features", 1, F.TYPE_MESSAGE, optional, ".tensorflow.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def text_feature(record: bytes, field: str, where: str) -> str:
    """The UTF-8 text of bytes feature ``field`` of a serialized Example."""
    from google.protobuf.message import DecodeError

    example = _example_class()()
    try:
        example.ParseFromString(record)
    except DecodeError:
        raise UsageError(f"{where}: not a serialized tf.train.Example") from None
    features = example.features.feature
    if field not in features:
        raise UsageError(f"{where}: no feature '{field}' (has: {', '.join(sorted(features))}); "
                         f"give --field")
    values = features[field].bytes_list.value
    if len(values) != 1:
        raise UsageError(f"{where}: feature '{field}' is not one bytes value")
    return values[0].decode("utf-8", errors="replace")


def example(**features: str | bytes) -> bytes:
    """A serialized Example of bytes features (how a TFDS text dataset stores a record)."""
    message = _example_class()()
    for name, value in features.items():
        data = value.encode() if isinstance(value, str) else value
        message.features.feature[name].bytes_list.value.append(data)
    return message.SerializeToString()
