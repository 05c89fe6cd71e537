"""Why a table topic's table is not keeping up: the state the plugin host records after each round and
``tabletopic tables`` prints (``<log.dirs>/__tables/<topic>/status.json``).

A partition is *stuck* when it is behind its high watermark and its rounds do not move it: ``blocked`` (a record
``errors.tolerance=none`` stops at, or a conversion that fails the same way every time) or ``failing`` (its
writes fail: storage or the conversion pool). A table's rounds can fail as a whole too (``round``: the catalog,
the merge, a schema change). Each entry keeps the reason and since when it holds (the time it was first seen with
that reason), so an operator sees how long a table has been stuck and why.

The file is informational: written without fsync on each change (a crash loses at most the last change, and the
next round writes it again); one home for its writer and its readers.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

STATUS_FILE = "status.json"
ROUND = "round"  # the entry of a failing round (the whole table), beside the partitions' entries


class TableStatus:
    """The stuck partitions (and failing rounds) of one table, kept in ``<state_dir>/status.json``."""

    def __init__(self, state_dir: Path, table: str) -> None:
        self._path = state_dir / STATUS_FILE
        self._table = table
        self._entries: dict[str, dict[str, Any]] = {}
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # since-times survive a restart
            doc = json.loads(self._path.read_text(encoding="utf-8"))
            self._entries = {str(k): dict(v) for k, v in doc["stuck"].items()}

    @property
    def stuck(self) -> dict[str, dict[str, Any]]:
        """Partition number (as text) or :data:`ROUND` → ``{"state", "reason", "since"}`` (since: epoch s)."""
        return {k: dict(v) for k, v in self._entries.items()}

    def update(self, partitions: Mapping[int, tuple[str, str]], rounds: tuple[str, str] | None) -> None:
        """The state after a round: ``partitions`` maps the stuck ones to (state, reason), ``rounds`` is (state,
        reason) of the table's rounds when they fail or are blocked (None: they run). A partition not named is
        healthy again; the file is written only when something changed (a reason that stays keeps its since)."""
        now = time.time()
        wanted = {str(p): (state, _cut(reason)) for p, (state, reason) in partitions.items()}
        if rounds is not None:  # a round that did not run learns nothing about the partitions: they stay
            wanted = {**{k: (v["state"], v["reason"]) for k, v in self._entries.items() if k != ROUND},
                      ROUND: (rounds[0], _cut(rounds[1]))}
        entries: dict[str, dict[str, Any]] = {}
        for key, (state, reason) in wanted.items():
            old = self._entries.get(key)
            same = old is not None and old.get("state") == state and old.get("reason") == reason
            entries[key] = old if same and old is not None else {"state": state, "reason": reason, "since": now}
        if entries != self._entries:
            self._entries = entries
            self._write()

    def retarget(self, table: str) -> None:
        """The topic's table is now ``table`` (its namespace changed): entries from now on name it."""
        if table != self._table:
            self._table = table
            if self._entries:
                self._write()

    def clear(self) -> None:
        """The table topic was deleted or turned off: nothing of it is stuck any more (the file goes)."""
        self._entries = {}
        self._path.unlink(missing_ok=True)

    def _write(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"table": self._table, "stuck": self._entries}), encoding="utf-8")
        os.replace(tmp, self._path)


def _cut(text: str, limit: int = 500) -> str:
    """One line of at most ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def read_statuses(tables_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Table name → its stuck entries (see :attr:`TableStatus.stuck`), for every topic state directory under
    ``tables_dir`` (``<log.dirs>/__tables``); unreadable files are left out."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(tables_dir.glob(f"*/{STATUS_FILE}")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            doc = json.loads(path.read_text(encoding="utf-8"))
            out[str(doc["table"])] = {str(k): dict(v) for k, v in doc["stuck"].items()}
    return out


def status_lines(tables_dir: Path, tables: list[str]) -> list[str]:
    """One line per stuck table: each stuck partition (or failing round) with its state, since when and why."""
    statuses = read_statuses(tables_dir)
    out: list[str] = []
    for name in tables:
        stuck = statuses.get(name)
        if not stuck:
            continue
        parts = []
        for key in sorted(stuck, key=lambda k: (k == ROUND, int(k) if k.isdigit() else 0)):
            entry = stuck[key]
            since = datetime.fromtimestamp(float(entry["since"]), tz=UTC).isoformat(sep=" ", timespec="seconds")
            what = "its rounds" if key == ROUND else f"partition {key}"
            parts.append(f"{what} {entry['state']} since {since} UTC: {entry['reason']}")
        out.append(f"(!) {name} is not keeping up: " + "; ".join(parts))
    return out
