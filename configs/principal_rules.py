"""``ssl.principal.mapping.rules``: Apache Kafka's SslPrincipalMapper, ported (the broker validates the rules at
start, an SSL listener applies them to each client certificate's distinguished name).

Rules are ``RULE:pattern/replacement/`` (``/L`` or ``/U`` after the replacement lowers or raises the result's case)
or ``DEFAULT`` (the name itself), separated by commas (whitespace and newlines around the commas are ignored). They
apply in order; the first whose pattern matches the whole name gives the principal's name; none:
NoMatchingRuleError.

Kafka compiles the pattern as a Java regular expression and writes the result with ``String.replaceAll``; here the
pattern is Python's ``re`` (compiled with ``re.ASCII``: Java's ``\\w``, ``\\d``, ``\\s``, ``\\b`` and ``(?i)`` are
ASCII-only too) with Java's named groups ``(?<name>...)`` and ``\\k<name>`` translated to Python's, and the
replacement follows Java's rules (``$1``, ``${name}``, ``\\$`` for a literal ``$``; not Python's ``\\1``), after
Kafka's own step that makes a ``$n`` naming a group the pattern lacks a literal text. Java constructs Python lacks
(``\\p{...}``, ``\\Q...\\E``, ``\\z``) are refused at start, with ``re``'s message. Beyond Kafka, text Kafka's
splitter would skip without a word (a rule followed by a newline and no comma) is refused at start, as is a
replacement that cannot be applied (``$`` with no group number): Kafka fails every connection that reaches it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_RULES = "DEFAULT"
_DOT = "[^\n\r\u0085\u2028\u2029]"  # Java's '.': no line terminator
_END = "(?=(?:\r\n|[\n\r\u0085\u2028\u2029])?\\Z)"  # Java's '$' without MULTILINE
# SslPrincipalMapper.RULE_PATTERN, RULE_SPLITTER and RULE_PARSER, with Java's '.' and '$'
_RULE = rf"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?){_DOT}*?|({_DOT}*?)"
_SPLITTER = re.compile(rf"\s*({_RULE})\s*(,\s*|{_END})", re.ASCII)
_PARSER = re.compile(_RULE, re.ASCII)
_BACK_REFERENCE = re.compile(r"\$([0-9]+)")
_GROUP_NAME = re.compile(r"\{([A-Za-z0-9]*)")  # Java's ${name}: ASCII letters and digits
_JAVA_NAMED_GROUP = re.compile(r"(?<!\\)((?:\\\\)*)\(\?<([A-Za-z][A-Za-z0-9]*)>")
_JAVA_NAMED_REFERENCE = re.compile(r"(?<!\\)((?:\\\\)*)\\k<([A-Za-z][A-Za-z0-9]*)>")
_JAVA_TRIM = "".join(map(chr, range(33)))  # String.trim() strips every character up to ' '
_INT_MAX = 2**31 - 1


class NoMatchingRuleError(Exception):
    """No rule gives a name for this distinguished name (Kafka's SslPrincipalMapper.NoMatchingRule): the client
    fails authentication."""


@dataclass(frozen=True)
class Rule:
    """One rule: DEFAULT (``pattern is None``) or ``RULE:pattern/replacement/[LU]``."""

    pattern: str | None = None  # as written (Java's syntax), for str()
    replacement: str = ""
    lower: bool = False
    upper: bool = False
    compiled: re.Pattern[str] | None = None
    parts: tuple[str | int, ...] = ()  # the replacement: literal texts and group numbers

    def apply(self, name: str) -> str | None:
        """The mapped name, or None when the pattern does not match the whole name."""
        if self.compiled is None:
            return name
        if self.compiled.fullmatch(name) is None:  # Matcher.matches()
            return None
        # Kafka then calls name.replaceAll(pattern, replacement): every match is replaced, not just the whole name
        result = self.compiled.sub(lambda m: "".join(p if isinstance(p, str) else m.group(p) or "" for p in self.parts),
                                   name)
        return result.lower() if self.lower else result.upper() if self.upper else result

    def __str__(self) -> str:
        if self.pattern is None:
            return "DEFAULT"
        return f"RULE:{self.pattern}/{self.replacement}{'/L' if self.lower else '/U' if self.upper else ''}"


@dataclass(frozen=True)
class PrincipalMapper:
    """The rules of one ``ssl.principal.mapping.rules`` value; :meth:`from_rules` parses them."""

    rules: tuple[Rule, ...]

    @classmethod
    def from_rules(cls, text: str | None) -> PrincipalMapper:
        """The rules of ``text`` (None: DEFAULT); ValueError with Kafka's text (``Invalid rule: ...``) for a
        malformed rule."""
        pieces, skipped = _split(DEFAULT_RULES if text is None else text)
        rules = tuple(rule for rule in map(_parse, pieces) if rule is not None)  # Kafka's errors first
        if skipped:  # Kafka's find() steps over it: a rule lost without a word
            raise ValueError(f"Invalid rule: `{skipped[0]}`, not followed by a comma (rules are separated by "
                             "commas)")
        return cls(rules)

    def name(self, distinguished_name: str) -> str:
        """The principal's name the first matching rule gives; NoMatchingRuleError when none does."""
        for rule in self.rules:
            name = rule.apply(distinguished_name)
            if name is not None:
                return name
        raise NoMatchingRuleError(f"No rules apply to {distinguished_name}, rules [{', '.join(map(str, self.rules))}]")

    def __str__(self) -> str:
        return f"SslPrincipalMapper(rules = [{', '.join(map(str, self.rules))}])"


def _split(text: str) -> tuple[list[str], list[str]]:
    """Kafka's splitRules: the rules, and the texts between them its splitter steps over."""
    text = text.strip(_JAVA_TRIM)
    rules, skipped, end = [], [], 0
    for m in _SPLITTER.finditer(text):
        if text[end:m.start()].strip():
            skipped.append(text[end:m.start()].strip())
        rules.append(m.group(1))
        end = m.end()
    return rules, skipped


def _parse(rule: str) -> Rule | None:
    m = _PARSER.match(rule)  # Matcher.lookingAt(): always matches (the last alternative may be empty)
    if m is None:
        raise ValueError(f"Invalid rule: {rule}")
    if m.end() != len(rule):
        raise ValueError(f"Invalid rule: `{rule}`, unmatched substring: `{rule[m.end():]}`")
    if m.group(1) is not None:
        return Rule()
    if m.group(2) is None:
        return None  # empty rules are ignored
    pattern, replacement, case = m.group(2), m.group(4), m.group(6)
    try:
        compiled = re.compile(_java_pattern(pattern), re.ASCII)
        parts = _replacement_parts(_escape_literal_back_references(replacement, compiled.groups), compiled)
    except (re.error, ValueError, IndexError) as e:
        raise ValueError(f"Invalid rule: `{rule}`, {e}") from e
    return Rule(pattern, replacement, case == "L", case == "U", compiled, parts)


def _java_pattern(pattern: str) -> str:
    """Java's named groups in Python's syntax (the rest of the two syntaxes is alike enough for these rules)."""
    return _JAVA_NAMED_REFERENCE.sub(r"\1(?P=\2)", _JAVA_NAMED_GROUP.sub(r"\1(?P<\2>", pattern))


def _escape_literal_back_references(replacement: str, groups: int) -> str:
    """Kafka's escapeLiteralBackReferences (from Apache NiFi): ``$n`` naming a group the pattern lacks becomes the
    literal ``$n``, after dropping digits while n is too large (``$12`` with one group is group 1 and "2").

    Ported as Kafka has it: the matches are found in the text as given while the escapes go into the changed text,
    so a second escape lands one character early."""
    if groups == 0:
        return replacement
    value = replacement
    for m in _BACK_REFERENCE.finditer(replacement):
        digits = m.group(1)
        if digits.startswith("0"):
            continue
        if int(digits) > _INT_MAX:  # Integer.parseInt
            raise ValueError(f'For input string: "{digits}"')
        index = int(digits)
        while index > groups and index >= 10:
            index //= 10
        if index > groups:
            start = m.start(1)
            value = value[:start - 1] + "\\" + value[start - 1:]
    return value


def _replacement_parts(replacement: str, pattern: re.Pattern[str]) -> tuple[str | int, ...]:
    """Java's Matcher.appendReplacement syntax: ``\\x`` is x, ``$n`` group n (the longest number naming a group),
    ``${name}`` a named group; Java's exception texts for the rest."""
    parts: list[str | int] = []
    i, n = 0, len(replacement)
    while i < n:
        c = replacement[i]
        if c == "\\":
            if i + 1 == n:
                raise ValueError("character to be escaped is missing")
            parts.append(replacement[i + 1])
            i += 2
        elif c == "$":
            group, i = _group_reference(replacement, i + 1, pattern)
            parts.append(group)
        else:
            parts.append(c)
            i += 1
    merged: list[str | int] = []
    for p in parts:
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        else:
            merged.append(p)
    return tuple(merged)


def _group_reference(text: str, i: int, pattern: re.Pattern[str]) -> tuple[int, int]:
    """The group number of the reference after a ``$`` at ``text[i:]``, and where the reference ends."""
    if i == len(text):
        raise ValueError("Illegal group reference: group index is missing")
    if text[i] == "{":
        m = _GROUP_NAME.match(text, i)
        name = m.group(1) if m else ""
        end = i + 1 + len(name)
        if not name:
            raise ValueError("named capturing group has 0 length name")
        if end == len(text) or text[end] != "}":
            raise ValueError("named capturing group is missing trailing '}'")
        if name[0].isdigit():
            raise ValueError(f"capturing group name {{{name}}} starts with digit character")
        if name not in pattern.groupindex:
            raise ValueError(f"No group with name {{{name}}}")
        return pattern.groupindex[name], end + 1
    if not "0" <= text[i] <= "9":
        raise ValueError("Illegal group reference")
    ref, i = ord(text[i]) - 48, i + 1
    while i < len(text) and "0" <= text[i] <= "9" and ref * 10 + ord(text[i]) - 48 <= pattern.groups:
        ref, i = ref * 10 + ord(text[i]) - 48, i + 1
    if ref > pattern.groups:
        raise IndexError(f"No group {ref}")
    return ref, i
