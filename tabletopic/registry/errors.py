"""Confluent Schema Registry's error codes and messages, and the exception that carries one to the HTTP layer.

The messages are Confluent's word for word (its ``rest/exceptions/Errors.java`` and the ``Rest*Exception``
classes), typos and missing spaces included: clients and scripts match on them.
"""

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
INCOMPATIBLE_SCHEMA = 40901  # 409 before Confluent 8.0.4 / 8.1; the HTTP status is 409 in both
INVALID_SCHEMA = 42201
INVALID_VERSION = 42202
INVALID_COMPATIBILITY_LEVEL = 42203
INVALID_MODE = 42204
OPERATION_NOT_PERMITTED = 42205
REFERENCE_EXISTS = 42206
INVALID_SUBJECT = 42208
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


def subject_not_found(subject: str | None) -> RegistryError:
    return RegistryError(404, SUBJECT_NOT_FOUND, f"Subject '{_java(subject)}' not found.")


def version_not_found(version: int) -> RegistryError:
    """``version``: the number asked for, -1 for ``latest`` (Confluent prints it so)."""
    return RegistryError(404, VERSION_NOT_FOUND, f"Version {version} not found.")


def schema_not_found(schema_id: int | None = None) -> RegistryError:
    text = "Schema not found" if schema_id is None else f"Schema {schema_id} not found"
    return RegistryError(404, SCHEMA_NOT_FOUND, text)


def subject_soft_deleted(subject: str) -> RegistryError:
    return RegistryError(404, SUBJECT_SOFT_DELETED,
                         f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently")


def subject_not_soft_deleted(subject: str) -> RegistryError:
    return RegistryError(404, SUBJECT_NOT_SOFT_DELETED,
                         f"Subject '{subject}' was not deleted first before being permanently deleted")


def version_soft_deleted(subject: str, version: int) -> RegistryError:
    return RegistryError(404, VERSION_SOFT_DELETED, f"Subject '{subject}' Version {version} was soft deleted."
                                                    "Set permanent=true to delete permanently")


def version_not_soft_deleted(subject: str, version: int) -> RegistryError:
    return RegistryError(404, VERSION_NOT_SOFT_DELETED, f"Subject '{subject}' Version {version} was not deleted "
                                                        "first before being permanently deleted")


def not_configured(subject: str, what: str) -> RegistryError:
    """40408 (``what``: compatibility) or 40409 (mode): the subject has no setting of its own."""
    code = SUBJECT_COMPATIBILITY_NOT_CONFIGURED if what == "compatibility" else SUBJECT_MODE_NOT_CONFIGURED
    return RegistryError(404, code, f"Subject '{subject}' does not have subject-level {what} configured")


def incompatible(subject: str, messages: list[str]) -> RegistryError:
    return RegistryError(409, INCOMPATIBLE_SCHEMA, f"Schema being registered is incompatible with an earlier "
                                                   f"schema for subject \"{subject}\", details: {java_list(messages)}")


def invalid_schema(message: str) -> RegistryError:
    """42201 with ``message`` as it is (Confluent answers the parser's exception message)."""
    return RegistryError(422, INVALID_SCHEMA, message)


def invalid_version(version: str) -> RegistryError:
    return RegistryError(
        422, INVALID_VERSION,
        f"The specified version '{version}' is not a valid version id. Allowed values are between "
        "[1, 2^31-1] and the string \"latest\"",
    )


def invalid_compatibility_level(level: object = None) -> RegistryError:
    """42203; Confluent's text does not name the value (``level`` is taken and left out)."""
    return RegistryError(
        422, INVALID_COMPATIBILITY_LEVEL,
        "Invalid compatibility level. Valid values are none, backward, forward, full, "
        "backward_transitive, forward_transitive, and full_transitive",
    )


def invalid_mode(mode: object = None) -> RegistryError:
    """42204; the text does not name the value either."""
    return RegistryError(422, INVALID_MODE, "Invalid mode. Valid values are READWRITE, READONLY, IMPORT and FORWARD.")


def invalid_subject(subject: str) -> RegistryError:
    return RegistryError(422, INVALID_SUBJECT, f"The specified subject '{subject}' is not a valid.")


def not_permitted(message: str) -> RegistryError:
    return RegistryError(422, OPERATION_NOT_PERMITTED, message)


def read_only(subject: str | None) -> RegistryError:
    # the default context prints as the empty string, hence the two spaces
    return not_permitted(f"Subject {_java(subject)} in context  is in read-only mode")


def reference_exists(subject: str, version: int) -> RegistryError:
    """42206, naming the referenced version by its ``_schemas`` record key as Java prints it."""
    return RegistryError(422, REFERENCE_EXISTS, f"One or more references exist to the schema "
                                                f"{{magic=1,keytype=SCHEMA,subject={subject},version={version}}}.")


def bad_request(message: str, status: int = 400) -> RegistryError:
    """A malformed request (not JSON, wrong shape, oversize): the HTTP status doubles as the error code."""
    return RegistryError(status, status, message)


def java_list(items: list[str]) -> str:
    """A list as Java's ``List.toString`` prints it: ``[a, b]``."""
    return "[" + ", ".join(items) + "]"


def _java(value: str | None) -> str:
    return "null" if value is None else value
