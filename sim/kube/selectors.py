"""Label selectors: a port of the API server's parser, and matching of requirements against labels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


class SelectorError(ValueError):
    pass


# A port of the label selector lexer and parser of kubernetes/kubernetes
# staging/src/k8s.io/apimachinery/pkg/labels/selector.go (Lexer, Parser.parse, parseRequirement,
# parseValues, parseIdentifiersList, parseExactValue, NewRequirement) and of the key and value checks of
# staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go (IsQualifiedName, IsValidLabelValue),
# so that a malformed selector gets the API server's own error text. The server answers it as a
# 400 BadRequest whose message is this error (apiserver handlers: DecodeParameters -> NewBadRequest).
_TOKENS = {")": "ClosedPar", ",": "Comma", "!": "DoesNotExist", "==": "DoubleEquals", "=": "Equals",
           ">": "GreaterThan", "in": "In", "<": "LessThan", "!=": "NotEquals", "notin": "NotIn", "(": "OpenPar"}

_SPECIAL = set("=!(),><")

_WHITESPACE = set(" \t\r\n")

_BINARY_OPERATORS = "in, notin, =, ==, !=, gt, lt"

_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"

_QUALIFIED_NAME_RE = re.compile(f"^{_QUALIFIED_NAME_FMT}$")

_DNS1123_SUBDOMAIN_FMT = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"

_DNS1123_SUBDOMAIN_RE = re.compile(f"^{_DNS1123_SUBDOMAIN_FMT}$")

_LABEL_VALUE_FMT = f"({_QUALIFIED_NAME_FMT})?"

_LABEL_VALUE_RE = re.compile(f"^{_LABEL_VALUE_FMT}$")


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    """validation.RegexError: the examples are joined with " or " after a trailing ", " (two spaces)."""
    return msg + " (e.g. " + " or ".join(f"'{e}', " for e in examples) + f"regex used for validation is '{fmt}')"


def _label_key_errors(key: str) -> list[str]:
    """validation.IsQualifiedName."""
    errs: list[str] = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                errs.append("prefix part must be no more than 253 characters")
            if not _DNS1123_SUBDOMAIN_RE.match(prefix):
                errs.append("prefix part " + _regex_error(
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                    "and must start and end with an alphanumeric character", _DNS1123_SUBDOMAIN_FMT, "example.com"))
    else:
        return ["a qualified name " + _regex_error(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
            "character", _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if not _QUALIFIED_NAME_RE.match(name):
        errs.append("name part " + _regex_error(
            "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
            "character", _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc"))
    return errs


def _label_value_errors(value: str) -> list[str]:
    """validation.IsValidLabelValue."""
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _LABEL_VALUE_RE.match(value):
        errs.append(_regex_error("a valid label must be an empty string or consist of alphanumeric characters, '-', "
                                 "'_' or '.', and must start and end with an alphanumeric character",
                                 _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def _lex(text: str) -> list[tuple[str, str]]:
    """Lexer.Lex over the whole input: (token, literal) pairs ending with ("EndOfString", "")."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            out.append(("EndOfString", ""))
            return out
        if text[i] in _SPECIAL:  # scanSpecialSymbol: the longest operator made of special symbols
            buf, last, j = "", None, i
            while j < n and text[j] in _SPECIAL:
                buf += text[j]
                if buf in _TOKENS:
                    last = (_TOKENS[buf], buf)
                    j += 1
                elif last is not None:
                    break
                else:
                    j += 1
            if last is None:
                out.append(("Error", f"error expected: keyword found '{buf}'"))
                i = j
            else:
                out.append(last)
                i += len(last[1])
            continue
        j = i  # scanIDOrKeyword
        while j < n and text[j] not in _SPECIAL and text[j] not in _WHITESPACE:
            j += 1
        word = text[i:j]
        out.append((_TOKENS.get(word, "Identifier"), word))
        i = j


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.pos = 0

    def _get(self, values: bool, advance: bool) -> tuple[str, str]:
        tok, lit = self.items[min(self.pos, len(self.items) - 1)]
        if advance:
            self.pos += 1
        if values and tok in ("In", "NotIn"):  # 'in' and 'notin' are plain values in a value context
            tok = "Identifier"
        return tok, lit

    def lookahead(self, values: bool = True) -> tuple[str, str]:
        return self._get(values, False)

    def consume(self, values: bool = True) -> tuple[str, str]:
        return self._get(values, True)

    def parse(self) -> list[tuple[str, str, tuple[str, ...]]]:
        reqs: list[tuple[str, str, tuple[str, ...]]] = []
        while True:
            tok, lit = self.lookahead()
            if tok in ("Identifier", "DoesNotExist"):
                try:
                    reqs.append(self.requirement())
                except SelectorError as e:
                    raise SelectorError(f"unable to parse requirement: {e}") from None
                t, lit2 = self.consume()
                if t == "EndOfString":
                    return reqs
                if t == "Comma":
                    t2, l2 = self.lookahead()
                    if t2 not in ("Identifier", "DoesNotExist"):
                        raise SelectorError(f"found '{l2}', expected: identifier after ','")
                else:
                    raise SelectorError(f"found '{lit2}', expected: ',' or 'end of string'")
            elif tok == "EndOfString":
                return reqs
            else:
                raise SelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")

    def requirement(self) -> tuple[str, str, tuple[str, ...]]:
        op = ""
        tok, key = self.consume()
        if tok == "DoesNotExist":
            op = "DoesNotExist"
            tok, key = self.consume()
        if tok != "Identifier":
            raise SelectorError(f"found '{key}', expected: identifier")
        errs = _label_key_errors(key)
        if errs:  # validateLabelKey with a nil field path
            raise SelectorError(f'<nil>: Invalid value: "{key}": {"; ".join(errs)}')
        if op == "DoesNotExist" or self.lookahead()[0] in ("EndOfString", "Comma"):
            # '!a=b' stops after 'a' (parseRequirement returns at once), so the '=' is what is refused
            return key, op or "Exists", ()
        tok, lit = self.consume(values=False)
        ops = {"In": "In", "NotIn": "NotIn", "Equals": "=", "DoubleEquals": "==", "NotEquals": "!=",
               "GreaterThan": "gt", "LessThan": "lt"}
        if tok not in ops:
            raise SelectorError(f"found '{lit}', expected: {_BINARY_OPERATORS}")
        operator = ops[tok]
        values = self.set_values() if operator in ("In", "NotIn") else self.exact_value()
        for i, v in enumerate(values):  # NewRequirement -> validateLabelValue(path values[i][key])
            verrs = _label_value_errors(v)
            if verrs:
                raise SelectorError(f'values[{i}][{key}]: Invalid value: "{v}": {"; ".join(verrs)}')
        if operator in ("gt", "lt"):
            try:
                int(values[0])
            except ValueError:
                raise SelectorError(f"values[0]: Invalid value: \"{values[0]}\": for 'Gt', 'Lt' operators, the value "
                                    "must be an integer") from None
            return key, "Gt" if operator == "gt" else "Lt", values
        if operator in ("=", "=="):
            return key, "In", values
        if operator == "!=":
            return key, "NotIn", values
        return key, operator, values

    def set_values(self) -> tuple[str, ...]:
        tok, lit = self.consume()
        if tok != "OpenPar":
            raise SelectorError(f"found '{lit}' expected: '('")
        tok, lit = self.lookahead()
        if tok in ("Identifier", "Comma"):
            values = self.identifiers()
            if self.consume()[0] != "ClosedPar":
                raise SelectorError(f"found '{lit}', expected: ')'")
            return tuple(sorted(values))
        if tok == "ClosedPar":
            self.consume()
            return ("",)
        raise SelectorError(f"found '{lit}', expected: ',', ')' or identifier")

    def identifiers(self) -> set[str]:
        values: set[str] = set()
        while True:
            tok, lit = self.consume()
            if tok == "Identifier":
                values.add(lit)
                tok2, lit2 = self.lookahead()
                if tok2 == "Comma":
                    continue
                if tok2 == "ClosedPar":
                    return values
                raise SelectorError(f"found '{lit2}', expected: ',' or ')'")
            if tok == "Comma":
                if not values:
                    values.add("")
                tok2 = self.lookahead()[0]
                if tok2 in ("ClosedPar", "Comma"):
                    values.add("")
                    if tok2 == "ClosedPar":
                        return values
                continue
            raise SelectorError(f"found '{lit}', expected: ',', or identifier")

    def exact_value(self) -> tuple[str, ...]:
        if self.lookahead()[0] in ("EndOfString", "Comma"):
            return ("",)
        tok, lit = self.consume()
        if tok == "Identifier":
            return (lit,)
        raise SelectorError(f"found '{lit}', expected: identifier")


def parse_label_selector(text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """``a=b,c!=d,e in (x,y),f notin (z),g,!h,n>3`` into (key, op, values) requirements, sorted by key
    as ``labels.Parse`` sorts them; a malformed selector raises :class:`SelectorError` with the real
    parser's message (``found '=', expected: ',' or 'end of string'``, ``unable to parse requirement:
    ...``)."""
    if not text:
        return []
    return sorted(_LabelParser(text).parse(), key=lambda r: r[0])


def match_requirements(labels: dict[str, str], reqs: Iterable[tuple[str, str, tuple[str, ...]]]) -> bool:
    for key, op, values in reqs:
        present = key in labels
        if op == "In" and (not present or labels[key] not in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
        if op in ("Gt", "Lt"):
            try:
                lv, rv = int(labels.get(key, "")), int(values[0])
            except (ValueError, IndexError):
                return False
            if (op == "Gt" and not lv > rv) or (op == "Lt" and not lv < rv):
                return False
    return True


def selector_requirements(selector: dict[str, Any] | None) -> list[tuple[str, str, tuple[str, ...]]]:
    """A metav1.LabelSelector (matchLabels + matchExpressions) as requirements."""
    selector = selector or {}
    reqs = [(k, "In", (str(v),)) for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for e in selector.get("matchExpressions") or []:
        reqs.append((e.get("key", ""), e.get("operator", "In"), tuple(e.get("values") or ())))
    return reqs
