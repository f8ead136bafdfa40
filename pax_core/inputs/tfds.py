"""TFDS's on-disk datasets, read without TensorFlow: ``tf.train.Example`` records in ArrayRecord
split files.

``tfds build`` writes a split as ``NAME-SPLIT.array_record-00000-of-NNNNN`` files, one serialized
``tf.train.Example`` per record (``c4/en``: ``text``, ``url``, ``timestamp``; ``imagenet2012``:
``image`` as JPEG bytes, ``label`` as an int64). The message types are built from their
definition (TensorFlow's ``example.proto`` and ``feature.proto``: Example → Features →
map<string, Feature> → BytesList / FloatList / Int64List) in a descriptor pool of their own, so
they work beside TensorFlow's generated classes.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pax_core.errors import UsageError


def tfds_split_files(folder: str | Path, split: str) -> list[Path]:
    """The ArrayRecord files of ``split`` in a TFDS dataset folder, in shard order."""
    return sorted(Path(folder).glob(f"*-{split}.array_record-*-of-*"))


@functools.cache
def _example_class() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="pax_core/tf_example.proto",
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


def parse_tf_example(record: bytes, where: str) -> dict[str, list]:
    """The features of a serialized ``tf.train.Example``: ``{name: values}``, each a list of
    bytes, floats or ints. ``where`` names the record in the one-line error a record that is no
    Example gets."""
    from google.protobuf.message import DecodeError

    example = _example_class()()
    try:
        example.ParseFromString(record)
    except DecodeError:
        raise UsageError(f"{where}: not a serialized tf.train.Example") from None
    return {name: list(getattr(feature, feature.WhichOneof("kind")).value)
            if feature.WhichOneof("kind") else []
            for name, feature in example.features.feature.items()}


def make_tf_example(**features: str | bytes | int | float | list) -> bytes:
    """A serialized ``tf.train.Example``: text and bytes as a bytes feature, ints as int64 and
    floats as float features (a list for several values), as TFDS writes them."""
    message = _example_class()()
    for name, value in features.items():
        values = value if isinstance(value, list) else [value]
        first = values[0] if values else b""
        if isinstance(first, bool | int):
            message.features.feature[name].int64_list.value.extend(values)
        elif isinstance(first, float):
            message.features.feature[name].float_list.value.extend(values)
        else:
            message.features.feature[name].bytes_list.value.extend(
                v.encode() if isinstance(v, str) else v for v in values)
    return message.SerializeToString()
