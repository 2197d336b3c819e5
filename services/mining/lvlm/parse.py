"""Dig the JSON out of a model answer and validate it, repairing what models typically break.

Structured output usually yields clean JSON, but answers still arrive fenced, wrapped in prose,
in Python syntax or cut at the token limit. Every repair is reported so the stored result says
how much the answer was trusted as is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

MAX_CANDIDATES = 50  # opening brackets tried as the start of the JSON; prose may contain a few
_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\r?\n?(.*?)(?:```|\Z)", re.DOTALL)
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_STOP = set("{}[]:,\"'") | {" ", "\t", "\r", "\n"}


class AnswerParseError(ValueError):
    """The answer holds nothing usable; the message says why."""


class _Mismatch(Exception):
    """The tokens starting at a candidate bracket are not JSON-like."""


@dataclass
class _Tok:
    kind: str  # one of "{}[]:," or "str" or "lit"
    text: str  # JSON text of the token
    cut: bool = False  # the answer ended inside this token
    key: bool = False


def _close_cut_string(body: str) -> str:
    # A dangling escape would swallow the closing quote.
    body = re.sub(r"\\u[0-9a-fA-F]{0,3}$", "", body)
    if (len(body) - len(body.rstrip("\\"))) % 2:
        body = body[:-1]
    return '"' + body + '"'


def _single_to_double(body: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            out.append("'" if body[i + 1] == "'" else body[i : i + 2])
            i += 2
            continue
        out.append('\\"' if c == '"' else c)
        i += 1
    return '"' + "".join(out) + '"'


def _tokenize(text: str, start: int, repairs: list[str]) -> tuple[list[_Tok], int, bool]:
    """Tokens of the value opening at ``start``; the end offset; whether the value closed."""
    toks: list[_Tok] = []
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "{[":
            depth += 1
            toks.append(_Tok(c, c))
            i += 1
        elif c in "}]":
            depth -= 1
            toks.append(_Tok(c, c))
            i += 1
            if depth == 0:
                return toks, i, True
        elif c in ":,":
            toks.append(_Tok(c, c))
            i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                toks.append(_Tok("str", _close_cut_string(text[i + 1 :]), cut=True))
            else:
                toks.append(_Tok("str", text[i : j + 1]))
            i = j + 1
        elif c == "'":
            # A quote is closing only before a delimiter, so apostrophes inside ('cell's') survive.
            j = i + 1
            while j < n:
                if text[j] == "\\":
                    j += 2
                    continue
                if text[j] == "'":
                    k = j + 1
                    while k < n and text[k].isspace():
                        k += 1
                    if k >= n or text[k] in ",:}]":
                        break
                j += 1
            toks.append(_Tok("str", _single_to_double(text[i + 1 : min(j, n)]), cut=j >= n))
            repairs.append("single quotes")
            i = j + 1
        else:
            j = i
            while j < n and text[j] not in _STOP:
                j += 1
            word = text[i:j]
            if word in _PY_LITERALS:
                word = _PY_LITERALS[word]
                repairs.append("python literals")
            toks.append(_Tok("lit", word, cut=j >= n))
            i = j
    return toks, n, False


def _regularize(toks: list[_Tok], repairs: list[str]) -> tuple[list[_Tok], list[str]]:
    """Tokens with commas fixed and keys marked; the brackets still open at the end."""
    out: list[_Tok] = []
    stack: list[list[str]] = []  # [bracket, what comes next: key, colon, value or comma]
    for tok in toks:
        top = stack[-1] if stack else None
        if tok.kind in "}]":
            if out and out[-1].kind == ",":
                out.pop()
                repairs.append("trailing comma")
            opener = "{" if tok.kind == "}" else "["
            if top is None or top[0] != opener or (opener == "{" and top[1] in ("colon", "value")):
                raise _Mismatch(f"unexpected {tok.kind!r}")
            stack.pop()
            out.append(tok)
            if stack:
                stack[-1][1] = "comma"
            continue
        if top is None:
            if out:
                raise _Mismatch("text after the value")
            if tok.kind not in "{[":
                raise _Mismatch("not an object or array")
        elif tok.kind == ",":
            if top[1] != "comma":
                repairs.append("stray comma")
                continue
            top[1] = "key" if top[0] == "{" else "value"
            out.append(tok)
            continue
        elif tok.kind == ":":
            if top[1] != "colon":
                raise _Mismatch("unexpected ':'")
            top[1] = "value"
            out.append(tok)
            continue
        elif top[1] == "comma":
            out.append(_Tok(",", ","))
            repairs.append("missing comma")
            top[1] = "key" if top[0] == "{" else "value"
        if top is not None and top[1] == "key":
            if tok.kind == "lit":
                tok = _Tok("str", json.dumps(tok.text), cut=tok.cut)
                repairs.append("unquoted keys")
            if tok.kind != "str":
                raise _Mismatch("an object key must be a string")
            tok.key = True
            top[1] = "colon"
            out.append(tok)
            continue
        if top is not None and top[1] == "colon":
            raise _Mismatch("missing ':' after a key")
        out.append(tok)
        if tok.kind in "{[":
            stack.append([tok.kind, "key" if tok.kind == "{" else "value"])
        elif top is not None:
            top[1] = "comma"
    return out, [entry[0] for entry in stack]


def _complete(toks: list[_Tok]) -> list[_Tok]:
    """Close a value cut at the token limit: drop what is half-written, then close the brackets."""
    while toks:
        last = toks[-1]
        # A number or literal cut mid-way may read differently in full (12 of 120): drop it.
        if last.kind in ",:" or last.key or (last.kind == "lit" and last.cut):
            toks.pop()
            continue
        # An array element cut before any of its content arrived is no element at all.
        if last.kind in "{[" and len(toks) > 1 and toks[-2].kind in ",[":
            toks.pop()
            continue
        break
    stack: list[str] = []
    for tok in toks:
        if tok.kind in "{[":
            stack.append(tok.kind)
        elif tok.kind in "}]":
            stack.pop()
    closers = {"{": "}", "[": "]"}
    return toks + [_Tok(closers[b], closers[b]) for b in reversed(stack)]


def _try_candidate(text: str, start: int) -> tuple[Any, list[str], int, bool]:
    repairs: list[str] = []
    toks, end, closed = _tokenize(text, start, repairs)
    toks, still_open = _regularize(toks, repairs)
    if not closed or still_open:
        toks = _complete(toks)
        repairs.append("truncated")
    try:
        value = json.loads("".join(t.text for t in toks), strict=False)
    except json.JSONDecodeError as exc:
        raise _Mismatch(str(exc)) from exc
    return value, repairs, end, closed


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _extract_from(text: str) -> tuple[Any, list[str]] | None:
    starts = [m.start() for m in re.finditer(r"[{\[]", text)][:MAX_CANDIDATES]
    for start in starts:
        try:
            value, repairs, end, closed = _try_candidate(text, start)
        except _Mismatch:
            continue
        if text[:start].strip():
            repairs.insert(0, "leading text")
        if closed and text[end:].strip():
            repairs.append("trailing text")
        return value, repairs
    return None


def extract_json(text: str) -> tuple[Any, list[str]]:
    """The first JSON object or array in a model answer, and the repairs it needed."""
    if not text or not text.strip():
        raise AnswerParseError("the answer is empty")
    fence = _FENCE.search(text)
    if fence is not None:
        found = _extract_from(fence.group(1))
        if found is not None:
            value, repairs = found
            # Prose around the fence is expected; only what is wrong inside it counts.
            return value, _dedupe(["code fence", *(r for r in repairs if r != "leading text")])
    if not re.search(r"[{\[]", text):
        raise AnswerParseError(f"no JSON object or array in the answer: {text.strip()[:80]!r}")
    found = _extract_from(text)
    if found is None:
        raise AnswerParseError(f"no parsable JSON in the answer: {text.strip()[:80]!r}")
    return found[0], _dedupe(found[1])


def _list_item_model(annotation: Any) -> type[BaseModel] | None:
    """The item model of a ``list[Model]`` field (also inside ``Optional``), else None."""
    if get_origin(annotation) is list:
        args = get_args(annotation)
        if args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            return args[0]
        return None
    for arg in get_args(annotation):
        if get_origin(arg) is list:
            return _list_item_model(arg)
    return None


def _list_fields(model: type[BaseModel]) -> list[str]:
    fields = model.model_fields
    return [name for name, f in fields.items() if get_origin(f.annotation) is list]


def _short_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]


def parse_answer(text: str, model: type[BaseModel]) -> tuple[BaseModel, list[str]]:
    """Validate an answer against ``model``, dropping bad list items rather than the whole answer."""
    value, repairs = extract_json(text)
    if isinstance(value, list):
        list_fields = _list_fields(model)
        if len(list_fields) != 1:
            raise AnswerParseError(f"the answer is a list but {model.__name__} expects an object")
        value = {list_fields[0]: value}
        repairs.append(f"wrapped list in {list_fields[0]!r}")
    if not isinstance(value, dict):
        raise AnswerParseError(f"the answer is a {type(value).__name__}, not an object")
    for name, field in model.model_fields.items():
        if name in value and value[name] is None and not field.is_required():
            del value[name]
            repairs.append(f"null {name} replaced by the default")
        item_model = _list_item_model(field.annotation)
        items = value.get(name)
        if item_model is None or not isinstance(items, list):
            continue
        kept: list[Any] = []
        reasons: list[str] = []
        for item in items:
            try:
                item_model.model_validate(item)
            except ValidationError as exc:
                reasons.append(_short_error(exc))
            else:
                kept.append(item)
        if reasons:
            if not kept:
                raise AnswerParseError(f"none of the {len(items)} {name} is valid: {reasons[0]}")
            repairs.append(f"dropped {len(reasons)} of {len(items)} {name}: {'; '.join(reasons[:3])}")
            value[name] = kept
    try:
        answer = model.model_validate(value)
    except ValidationError as exc:
        raise AnswerParseError(f"the answer does not fit {model.__name__}: {_short_error(exc)}") from exc
    return answer, repairs
