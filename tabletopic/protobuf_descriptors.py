"""Protobuf descriptors as the schema registry stores them, shared by the registry (which checks schemas) and the
workers (which decode payloads): pure, no I/O.

A PROTOBUF schema travels as the base64 of a ``FileDescriptorProto`` (what confluent-kafka's serializer registers
and what a registry answers with ``format=serialized``); its imports are its references, named by the path they
are imported by. confluent-kafka's ``ProtobufSerializer`` does not send the imports it considers built in
(``google/protobuf/*``, ``google/type/*``, ``confluent/*``; ``skip.known.types``, on by default) as references:
:func:`build_pool` takes those from the protobuf runtime (the well-known types, always loaded) or, for the others,
from the packages that ship them when they are installed (googleapis-common-protos, confluent-kafka), loaded only
when a file imports them.
"""

from __future__ import annotations

import base64
import binascii
import importlib
from collections.abc import Iterable

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message import DecodeError

FDP = descriptor_pb2.FileDescriptorProto

# Imports confluent-kafka never sends as references; where their descriptors come from (a module prefix).
_BUILTIN_PREFIXES = {"google/protobuf/": "google.protobuf.", "google/type/": "google.type.",
                     "confluent/": "confluent_kafka.schema_registry.confluent."}


def _well_known_files() -> list[bytes]:
    from google.protobuf import (
        any_pb2,
        api_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        source_context_pb2,
        struct_pb2,
        timestamp_pb2,
        type_pb2,
        wrappers_pb2,
    )

    modules = (any_pb2, source_context_pb2, type_pb2, api_pb2, descriptor_pb2, duration_pb2, empty_pb2,
               field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2)  # each after its own imports
    return [m.DESCRIPTOR.serialized_pb for m in modules]


def is_builtin(name: str) -> bool:
    """Whether ``name`` is an import path confluent-kafka treats as built in (never a reference)."""
    return name.startswith(tuple(_BUILTIN_PREFIXES))


def builtin_file(name: str) -> bytes | None:
    """The serialized descriptor of the built-in file ``name`` (``google/type/date.proto``), from the installed
    package that generated it; None when it is not built in or not installed."""
    prefix = next((p for p in _BUILTIN_PREFIXES if name.startswith(p)), None)
    if prefix is None or not name.endswith(".proto"):
        return None
    module = _BUILTIN_PREFIXES[prefix] + name[len(prefix):-len(".proto")].replace("/", ".") + "_pb2"
    try:
        return bytes(importlib.import_module(module).DESCRIPTOR.serialized_pb)
    except Exception:  # not installed, or a path no module matches: the import stays unknown
        return None


def from_base64(text: str) -> FDP | None:
    """The descriptor a base64 text holds, or None when the text is not one (then it may be ``.proto`` text)."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        fdp = FDP()
        fdp.ParseFromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        return None
    return fdp


def build_pool(files: Iterable[FDP]) -> descriptor_pool.DescriptorPool:
    """A pool holding the well-known types and ``files`` (each after the files it imports). A file named like a
    built-in one already loaded is skipped (confluent-kafka with ``skip.known.types=false`` sends the well-known
    files as references; the runtime's copy is the same file); a built-in import no file provides is loaded from
    its package. Raises TypeError (the pool's refusal: an unknown import, a duplicate name) for a bad set."""
    pool = descriptor_pool.DescriptorPool()
    loaded: set[str] = set()
    for raw in _well_known_files():
        pool.AddSerializedFile(raw)
        loaded.add(FDP.FromString(raw).name)

    def add_builtin(name: str) -> None:
        raw = builtin_file(name)
        if raw is None or name in loaded:
            return
        fdp = FDP.FromString(raw)
        for dep in fdp.dependency:
            add_builtin(dep)
        pool.Add(fdp)
        loaded.add(name)

    for fdp in files:
        if fdp.name in loaded and is_builtin(fdp.name):
            continue
        for dep in fdp.dependency:
            if dep not in loaded:
                add_builtin(dep)
        pool.Add(fdp)
        loaded.add(fdp.name)
    return pool
