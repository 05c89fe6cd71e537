"""A registry of named implementations (converters, transforms), filled when their modules are imported.

Pool processes look implementations up by name, so only names cross the process boundary.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    """Implementations of one interface by name, in registration order."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._items: dict[str, T] = {}

    def register(self, item: T) -> T:
        """Make ``item`` available under its name (done once, when its module is imported)."""
        if item.name in self._items:
            raise ValueError(f"a {self._kind} named {item.name!r} is already registered")
        self._items[item.name] = item
        return item

    def get(self, name: str) -> T:
        """The implementation registered as ``name`` (KeyError when there is none)."""
        return self._items[name]

    def all(self) -> tuple[T, ...]:
        return tuple(self._items.values())
