"""Compatibility levels and the seam every schema type plugs into.

A schema type parses a schema text (with the texts of the schemas it references) into a :class:`ParsedSchema`,
which gives its stored text and answers one question: can it, as the reader, read data written with another
schema of its type? The levels are built from that question alone, as Confluent's registry does:

- BACKWARD: the new schema reads data written with the latest version; FORWARD: the latest version reads data
  written with the new schema; FULL: both.
- The ``_TRANSITIVE`` variants ask the same of every live version, not only the latest. NONE asks nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol

from tabletopic.registry.errors import invalid_compatibility_level


class Level(StrEnum):
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"
    NONE = "NONE"

    @property
    def transitive(self) -> bool:
        return self.value.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        return self.value.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        return self.value.startswith(("FORWARD", "FULL"))


DEFAULT_LEVEL = Level.BACKWARD


def parse_level(value: object) -> Level:
    """A level from a request (case-insensitive, as Confluent accepts it); 42203 otherwise."""
    if isinstance(value, str):
        try:
            return Level(value.strip().upper())
        except ValueError:
            pass
    raise invalid_compatibility_level(value)


Dependency = tuple[str, str]
"""A referenced schema: (the name the reference gives it, e.g. an Avro type name or a JSON ``$ref`` URL; its text)."""


class ParsedSchema(Protocol):
    """A parsed, valid schema of one type."""

    def text(self, normalize: bool) -> str:
        """The text stored and compared for identity (same text, type and references → same id); ``normalize``
        gives a form in which equivalent spellings of one schema coincide."""
        ...

    def formatted(self, fmt: str) -> str:
        """The text Confluent's ``format`` query parameter asks for (``serialized`` for PROTOBUF: the base64
        descriptor; ``resolved`` for AVRO: referenced types inline); a format the type does not have gives the
        stored text."""
        ...

    def can_read(self, writer: ParsedSchema) -> list[str]:
        """Why this schema, as the reader, cannot read data written with ``writer`` (empty: it can)."""
        ...


class SchemaFormat(Protocol):
    """One schema type (AVRO, ...)."""

    name: str

    def parse(self, text: str, dependencies: Sequence[Dependency]) -> ParsedSchema:
        """Parse ``text``; ``dependencies`` are the schemas it references, each after the ones it references
        itself (a schema reached under several names comes once per name). Raises RegistryError 42201 for an
        invalid schema."""
        ...


def incompatibilities(level: Level, new: ParsedSchema, previous: Sequence[tuple[int, ParsedSchema]]) -> list[str]:
    """Why ``new`` breaks ``level`` against ``previous`` (the live versions, oldest first, with their version
    numbers); empty when it does not."""
    if level is Level.NONE or not previous:
        return []
    targets = previous if level.transitive else previous[-1:]
    out: list[str] = []
    for version, old in reversed(targets):
        if level.backward:
            out += [f"version {version}: the new schema cannot read data written with it: {m}"
                    for m in new.can_read(old)]
        if level.forward:
            out += [f"version {version}: it cannot read data written with the new schema: {m}"
                    for m in old.can_read(new)]
    return out
