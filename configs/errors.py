"""The configuration model's errors. Kafka-neutral: the broker maps them to error codes (:mod:`tabletopic.errors`)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A refused setting or settings change; ``message`` is the text for the user (Kafka's wording)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidConfigError(ConfigError):
    """A setting has an unknown name, a bad type or an out-of-range value, or breaks a rule between settings.

    ``key`` and ``value`` name the offending setting and value when there is one (None otherwise).
    """

    def __init__(self, message: str, *, key: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.key = key
        self.value = value

    @classmethod
    def invalid_value(cls, key: str, value: object, problem: str) -> InvalidConfigError:
        """``Invalid value <value> for configuration <key>: <problem>`` (Kafka's ConfigException wording)."""
        return cls(f"Invalid value {value} for configuration {key}: {problem}", key=key, value=value)


class InvalidRequestError(ConfigError):
    """A settings change that is malformed whatever the settings are: a name given twice, an unknown operation."""
