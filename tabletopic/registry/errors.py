"""Confluent Schema Registry's error codes and the exception that carries one to the HTTP layer."""

from __future__ import annotations

SUBJECT_NOT_FOUND = 40401
VERSION_NOT_FOUND = 40402
SCHEMA_NOT_FOUND = 40403
SUBJECT_SOFT_DELETED = 40404
SUBJECT_NOT_SOFT_DELETED = 40405
VERSION_SOFT_DELETED = 40406
VERSION_NOT_SOFT_DELETED = 40407
SUBJECT_COMPATIBILITY_NOT_CONFIGURED = 40408
SUBJECT_MODE_NOT_CONFIGURED = 40409
INCOMPATIBLE_SCHEMA = 409
INVALID_SCHEMA = 42201
INVALID_VERSION = 42202
INVALID_COMPATIBILITY_LEVEL = 42203
INVALID_MODE = 42204
OPERATION_NOT_PERMITTED = 42205
REFERENCE_EXISTS = 42206
STORE_ERROR = 50001


class RegistryError(Exception):
    """A refusal with Confluent's HTTP status, error code and message (``{"error_code": ..., "message": ...}``)."""

    def __init__(self, status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message

    def body(self) -> dict[str, object]:
        return {"error_code": self.error_code, "message": self.message}


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, SUBJECT_NOT_FOUND, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version: object) -> RegistryError:
    return RegistryError(404, VERSION_NOT_FOUND, f"Version {version} not found for subject '{subject}'.")


def schema_not_found(what: object = None) -> RegistryError:
    return RegistryError(404, SCHEMA_NOT_FOUND, "Schema not found" if what is None else f"Schema {what} not found")


def invalid_schema(message: str) -> RegistryError:
    return RegistryError(422, INVALID_SCHEMA, f"Invalid schema: {message}")


def invalid_version(version: object) -> RegistryError:
    return RegistryError(
        422, INVALID_VERSION,
        f"The specified version '{version}' is not a valid version id. Allowed values are between "
        "[1, 2^31-1] and the string \"latest\"",
    )


def invalid_compatibility_level(level: object) -> RegistryError:
    return RegistryError(
        422, INVALID_COMPATIBILITY_LEVEL,
        f"Invalid compatibility level {level!r}. Valid values are none, backward, forward, full, "
        "backward_transitive, forward_transitive, and full_transitive",
    )


def invalid_mode(mode: object) -> RegistryError:
    return RegistryError(
        422, INVALID_MODE, f"Invalid mode {mode!r}. Valid values are READWRITE, READONLY, READONLY_OVERRIDE, IMPORT"
    )


def not_permitted(message: str) -> RegistryError:
    return RegistryError(422, OPERATION_NOT_PERMITTED, message)


def bad_request(message: str, status: int = 400) -> RegistryError:
    """A malformed request (not JSON, wrong shape, oversize): the HTTP status doubles as the error code."""
    return RegistryError(status, status, message)
