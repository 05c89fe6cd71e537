"""ScramCredentialStore: the SCRAM credentials the broker keeps, user -> mechanism -> ScramCredential.

Durable in one JSON file (mode 0600) replaced atomically through ``tabletopic.durable``; loaded at construction,
a missing file being an empty store. Only what RFC 5802 / Kafka's ``ScramCredential`` keep is stored (salt,
stored key, server key, iterations, the bytes base64): never a password. Every change writes the file before it
returns (``apply`` writes once for several changes); the writes fsync, so the broker calls them off its loop.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tabletopic.durable import atomic_write_json, temp_path
from tabletopic.security.sasl import SCRAM_MECHANISMS, ScramCredential

FILE_MODE = 0o600
FORMAT_VERSION = 1


@dataclass(frozen=True)
class CredentialChange:
    """One change of :meth:`ScramCredentialStore.apply`: set ``credential``, or delete when it is None."""

    user: str
    mechanism: str
    credential: ScramCredential | None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _credential_doc(credential: ScramCredential) -> dict[str, object]:
    return {
        "salt": _b64(credential.salt),
        "stored_key": _b64(credential.stored_key),
        "server_key": _b64(credential.server_key),
        "iterations": credential.iterations,
    }


def _credential_of(doc: object) -> ScramCredential:
    if not isinstance(doc, dict) or not isinstance(doc.get("iterations"), int):
        raise ValueError(f"not a SCRAM credential: {doc!r}")
    try:
        parts = [base64.b64decode(doc[k], validate=True) for k in ("salt", "stored_key", "server_key")]
    except (KeyError, TypeError, binascii.Error) as e:
        raise ValueError(f"not a SCRAM credential: {e}") from e
    return ScramCredential(parts[0], parts[1], parts[2], doc["iterations"])


def _check_mechanism(mechanism: str) -> None:
    if mechanism not in SCRAM_MECHANISMS:
        raise ValueError(f"Unknown SCRAM mechanism {mechanism!r}: expected one of {sorted(SCRAM_MECHANISMS)}")


class ScramCredentialStore:
    """The broker's SCRAM credentials in ``path``; safe to call from several threads."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._users: dict[str, dict[str, ScramCredential]] = self._load()

    def _load(self) -> dict[str, dict[str, ScramCredential]]:
        try:
            doc = json.loads(self._path.read_bytes())
        except FileNotFoundError:
            return {}
        except ValueError as e:
            raise ValueError(f"{self._path}: not a SCRAM credential file: {e}") from e
        if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or not isinstance(doc.get("users"), dict):
            raise ValueError(f"{self._path}: not a SCRAM credential file of version {FORMAT_VERSION}")
        users: dict[str, object] = doc["users"]
        loaded: dict[str, dict[str, ScramCredential]] = {}
        for user, mechanisms in users.items():
            if not isinstance(mechanisms, dict):
                raise ValueError(f"{self._path}: user {user!r}: not a mechanism map")
            for mechanism, credential in mechanisms.items():
                try:
                    _check_mechanism(mechanism)
                    loaded.setdefault(user, {})[mechanism] = _credential_of(credential)
                except ValueError as e:
                    raise ValueError(f"{self._path}: user {user!r} {mechanism}: {e}") from e
        return loaded

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        """The credential of ``user`` for ``mechanism``, None when it has none."""
        with self._lock:
            return self._users.get(user, {}).get(mechanism)

    def describe(self, user: str) -> list[tuple[str, int]]:
        """(mechanism, iterations) of each credential of ``user``, by mechanism name; [] for an unknown user."""
        with self._lock:
            return sorted((m, c.iterations) for m, c in self._users.get(user, {}).items())

    def users(self) -> list[str]:
        """The users that have at least one credential, sorted."""
        with self._lock:
            return sorted(self._users)

    def upsert(self, user: str, mechanism: str, credential: ScramCredential) -> None:
        """Set ``user``'s credential for ``mechanism`` (ValueError for an unknown mechanism), durably."""
        self.apply([CredentialChange(user, mechanism, credential)])

    def delete(self, user: str, mechanism: str) -> bool:
        """Remove ``user``'s credential for ``mechanism``, durably; False when there was none."""
        return self.apply([CredentialChange(user, mechanism, None)])[0]

    def apply(self, changes: Iterable[CredentialChange]) -> list[bool]:
        """Apply ``changes`` in order, then write the file once (not at all when nothing changed).

        Per change: True when it set a credential or deleted one that existed. An unknown mechanism raises
        ValueError before anything changes; a failed write leaves memory and file as they were.
        """
        changes = list(changes)
        for change in changes:
            _check_mechanism(change.mechanism)
        with self._lock:
            users = {user: dict(mechanisms) for user, mechanisms in self._users.items()}
            results = [_apply_one(users, change) for change in changes]
            if any(results):
                self._write(users)
                self._users = users
            return results

    def _write(self, users: dict[str, dict[str, ScramCredential]]) -> None:
        doc = {
            "version": FORMAT_VERSION,
            "users": {u: {m: _credential_doc(c) for m, c in sorted(ms.items())} for u, ms in sorted(users.items())},
        }
        self._path.parent.mkdir(parents=True, exist_ok=True)
        # atomic_write_json writes into the temp file it finds: created 0600 here, the keys are never readable
        # by others, not even between the write and the rename
        fd = os.open(temp_path(self._path), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)
        finally:
            os.close(fd)
        atomic_write_json(self._path, doc)


def _apply_one(users: dict[str, dict[str, ScramCredential]], change: CredentialChange) -> bool:
    if change.credential is not None:
        users.setdefault(change.user, {})[change.mechanism] = change.credential
        return True
    mechanisms = users.get(change.user, {})
    if mechanisms.pop(change.mechanism, None) is None:
        return False
    if not mechanisms:
        del users[change.user]
    return True
