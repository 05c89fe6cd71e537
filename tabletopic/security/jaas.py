"""``sasl.jaas.config`` values parsed as Apache Kafka's ``JaasConfig`` parses them, and the PLAIN users in them.

Grammar (Kafka's ``JaasConfig`` over ``java.io.StreamTokenizer``): one or more entries
``<loginModuleClass> <controlFlag> (<optionName>=<optionValue>)* ;`` with ``//`` and ``/* */`` comments, values
quoted (``"..."`` or ``'...'``, with Java's escapes) or unquoted words (a number is not a value: quote it).
Malformed text raises ``ValueError`` with Kafka's message. The tokenizer below is a port of the JDK's
``StreamTokenizer.nextToken`` with the character classes Kafka sets, so odd input splits into the same tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
JAAS_USER_PREFIX = "user_"  # PlainServerCallbackHandler.JAAS_USER_PREFIX

CONTROL_FLAGS = ("required", "requisite", "sufficient", "optional")


@dataclass(frozen=True)
class JaasEntry:
    """One login module entry (Java's ``AppConfigurationEntry``); ``control_flag`` is lower case."""

    login_module: str
    control_flag: str
    options: dict[str, str]


# StreamTokenizer's token types and character classes (java.io.StreamTokenizer)
TT_EOF = -1
TT_NUMBER = -2
TT_WORD = -3
_NEED_CHAR = 0x7FFFFFFF
_WHITESPACE, _DIGIT, _ALPHA, _QUOTE, _COMMENT = 1, 2, 4, 8, 16
_LF, _CR, _SLASH, _STAR, _BACKSLASH = ord("\n"), ord("\r"), ord("/"), ord("*"), ord("\\")
_SEMICOLON, _EQUALS, _MINUS, _DOT = ord(";"), ord("="), ord("-"), ord(".")
_ESCAPES = {ord("a"): 0x7, ord("b"): 0x8, ord("f"): 0xC, ord("n"): 0xA, ord("r"): 0xD, ord("t"): 0x9, ord("v"): 0xB}


def _ctype_table() -> list[int]:
    """The classes after StreamTokenizer's constructor and Kafka's ``wordChars('-')``, ``('_')``, ``('$')``."""
    table = [0] * 256
    for low, high in ((ord("a"), ord("z")), (ord("A"), ord("Z")), (160, 255)):
        for c in range(low, high + 1):
            table[c] |= _ALPHA
    for c in range(ord(" ") + 1):
        table[c] = _WHITESPACE
    table[_SLASH] = _COMMENT
    table[ord('"')] = table[ord("'")] = _QUOTE
    for c in (*range(ord("0"), ord("9") + 1), _DOT, _MINUS):
        table[c] |= _DIGIT
    for c in (_MINUS, ord("_"), ord("$")):
        table[c] |= _ALPHA
    return table


_CTYPE = _ctype_table()


def _ctype(c: int) -> int:
    return _CTYPE[c] if c < 256 else _ALPHA


def _is_digit(c: int) -> bool:
    return ord("0") <= c <= ord("9")


class _Tokenizer:
    """``java.io.StreamTokenizer`` as Kafka's JaasConfig sets it up (comments on, EOL not significant)."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._pos = 0
        self._peek = _NEED_CHAR
        self.ttype = TT_EOF
        self.sval: str | None = None

    def _read(self) -> int:
        if self._pos >= len(self._text):
            return -1
        c = ord(self._text[self._pos])
        self._pos += 1
        return c

    def next_token(self) -> int:
        """The next token's type (``sval`` holds a word's or quoted string's text, else None)."""
        while True:
            self.sval = None
            c = self._peek if self._peek >= 0 else _NEED_CHAR
            if c == _NEED_CHAR:
                c = self._read()
                if c < 0:
                    return self._set(TT_EOF)
            self.ttype = c
            self._peek = _NEED_CHAR
            c = self._skip_whitespace(c)
            if c < 0:
                return self._set(TT_EOF)
            ctype = _ctype(c)
            if ctype & _DIGIT:
                return self._number(c)
            if ctype & _ALPHA:
                return self._word(c)
            if ctype & _QUOTE:
                return self._quoted(c)
            if c == _SLASH:
                if self._comment():
                    continue
                return self._set(TT_EOF)
            return self._set(c)

    def _set(self, ttype: int) -> int:
        self.ttype = ttype
        return ttype

    def _skip_whitespace(self, c: int) -> int:
        while c >= 0 and _ctype(c) & _WHITESPACE:
            if c == _CR:
                c = self._read()
                if c == _LF:
                    c = self._read()
            else:
                c = self._read()
        return c

    def _number(self, c: int) -> int:
        if c == _MINUS:
            c = self._read()
            if c != _DOT and not _is_digit(c):
                self._peek = c
                return self._set(_MINUS)
        seen_dot = False
        while (c == _DOT and not seen_dot) or _is_digit(c):
            seen_dot = seen_dot or c == _DOT
            c = self._read()
        self._peek = c
        return self._set(TT_NUMBER)

    def _word(self, c: int) -> int:
        chars = [chr(c)]
        c = self._read()
        while c >= 0 and _ctype(c) & (_ALPHA | _DIGIT):
            chars.append(chr(c))
            c = self._read()
        self._peek = c
        self.sval = "".join(chars)
        return self._set(TT_WORD)

    def _quoted(self, quote: int) -> int:
        chars: list[str] = []
        d = self._read()
        while d >= 0 and d not in (quote, _LF, _CR):
            if d == _BACKSLASH:
                c, d = self._escape()
            else:
                c, d = d, self._read()
            chars.append(chr(c) if c >= 0 else "\uffff")  # Java's (char) -1 after a backslash at the end
        self._peek = _NEED_CHAR if d == quote else d
        self.sval = "".join(chars)
        return self._set(quote)

    def _escape(self) -> tuple[int, int]:
        """After a backslash: the character it stands for and the lookahead (octal takes up to 3 digits)."""
        c = self._read()
        first = c
        if not ord("0") <= c <= ord("7"):
            return _ESCAPES.get(c, c), self._read()
        c -= ord("0")
        c2 = self._read()
        if not ord("0") <= c2 <= ord("7"):
            return c, c2
        c = (c << 3) + (c2 - ord("0"))
        c2 = self._read()
        if ord("0") <= c2 <= ord("7") and first <= ord("3"):
            return (c << 3) + (c2 - ord("0")), self._read()
        return c, c2

    def _comment(self) -> bool:
        """After '/': skip a ``/* */`` or a line comment; False when the input ends inside ``/* */``."""
        c = self._read()
        if c == _STAR:
            prev = 0
            while True:
                c = self._read()
                if c == _SLASH and prev == _STAR:
                    return True
                if c == _CR:
                    c = self._read()
                    if c == _LF:
                        c = self._read()
                elif c == _LF:
                    c = self._read()
                if c < 0:
                    return False
                prev = c
        # "//" and, '/' being a comment character, '/' followed by anything: the rest of the line
        c = self._read()
        while c >= 0 and c not in (_LF, _CR):
            c = self._read()
        self._peek = c
        return True


def _control_flag(flag: str | None) -> str:
    if flag is None:
        raise ValueError("Login module control flag is not available in the JAAS config")
    for known in CONTROL_FLAGS:
        if flag.upper() == known.upper():  # Java: flag.toUpperCase(Locale.ROOT)
            return known
    raise ValueError(f"Invalid login module control flag '{flag}' in JAAS config")


def _parse_entry(tokenizer: _Tokenizer) -> JaasEntry:
    login_module = tokenizer.sval
    if tokenizer.next_token() == TT_EOF:
        raise ValueError("Login module control flag not specified in JAAS config")
    control_flag = _control_flag(tokenizer.sval)
    options: dict[str, str] = {}
    while tokenizer.next_token() != TT_EOF and tokenizer.ttype != _SEMICOLON:
        key = tokenizer.sval
        if tokenizer.next_token() != _EQUALS or tokenizer.next_token() == TT_EOF or tokenizer.sval is None:
            raise ValueError(f"Value not specified for key '{'null' if key is None else key}' in JAAS config")
        if key is not None:  # Kafka keeps it under a null key no option name ever reads
            options[key] = tokenizer.sval
    if tokenizer.ttype != _SEMICOLON:
        raise ValueError("JAAS config entry not terminated by semi-colon")
    if not login_module:
        # Java's AppConfigurationEntry refuses an empty or missing class name, with no message
        raise ValueError("Login module not specified in JAAS config")
    return JaasEntry(login_module, control_flag, options)


def parse_jaas(text: str) -> list[JaasEntry]:
    """The entries of a ``sasl.jaas.config`` value, in order (Kafka's ``JaasConfig``); ValueError as Kafka's."""
    tokenizer = _Tokenizer(text)
    entries: list[JaasEntry] = []
    while tokenizer.next_token() != TT_EOF:
        entries.append(_parse_entry(tokenizer))
    if not entries:
        raise ValueError("Login module not specified in JAAS config")
    return entries


def plain_users(entries: Iterable[JaasEntry]) -> dict[str, str]:
    """username -> password from the ``user_<name>`` options of the PlainLoginModule entries.

    As Kafka's ``PlainServerCallbackHandler`` reads them (``JaasContext.configEntryOption``): only entries of
    ``org.apache.kafka.common.security.plain.PlainLoginModule``, the first entry naming a user wins.
    """
    users: dict[str, str] = {}
    for entry in entries:
        if entry.login_module != PLAIN_LOGIN_MODULE:
            continue
        for key, value in entry.options.items():
            if key.startswith(JAAS_USER_PREFIX):
                users.setdefault(key[len(JAAS_USER_PREFIX) :], value)
    return users
