"""``transform.value.type=none``: the converted columns as they are."""

from __future__ import annotations

from worker.transforms.base import Columns, register


class NoTransform:
    name = "none"

    def apply(self, columns: Columns) -> Columns:
        return columns


NONE = register(NoTransform())
