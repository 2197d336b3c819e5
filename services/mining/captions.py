"""Panel-aware caption splitting: which caption text describes which panel.

``split_caption(caption, labels)`` reads the label conventions of biomedical figure captions and
returns a :class:`~p2p.mining.types.CaptionSplit`.

Label conventions
-----------------
* Labels before their text ("(A) ...", "A. ...", "A) ...", "A: ...", "A, ...", "a Filtered ...",
  "b, c The ...", "A and C: ...") or after it ("... stained for LDLR (a); ... for SR-BI (b)."). The
  reading (before / after) that explains more labels wins; a caption may start its sentences with
  labels and still end clauses with them ("(iii) ... stained (arrows) and S6 was found (iv).").
* Ranges and lists: "A-D", "a-c" with an en dash, "(D-F)", "(B, C)", "B and C", "(a,b)",
  "((a), (b))", "(c, d, and e)", "(B) and C)", "(image A and B)", "(C, in red, 200*)".
* Compound labels ("1a", "B1", "c1-c6", "A1-3"), letter + roman sub-panels ("Ai", "(Aii)",
  "Ai-iii"), primes ("A'", "B" + U+2032, U+2019, U+2033; "A'-C'"), either case, roman numerals
  when the caption (or the hint) counts with them, position words ("Left panel:", "Top:",
  "(right)") when a caption has no letters, a word before a bare label ("Panel A:", "Panels B
  and C."). A letter + roman token is a label only in a series from "i" or when the hint names
  it ("blood vessel (Bv)" is text).
* A group and then its members: "(A-C) ... (A) ... (B) ..." or "(b-d) H&E staining at 1 month (b),
  at 3 months (c) and at 6 months (d)." gives each member the group text and its own clause. A
  plain label the hint lacks whose sub-panels it has ("(c) Sections ... (c1-c6) ..." with panels
  c1 to c6) is such a group: its text, and sentences naming it, go to every member. Sub-panels the
  hint lacks of a panel it has whole ("(a) ... (a1-a3) Close-ups ..." with panels a, b, c) are
  part of that panel's text.

Inline references never start fragments: a label already described ("(b) of the SMNp", "as in
(A)"), a reference word before it ("Fig. 5b", "compared with (b)", "see (C)"), a number before it
("P < 0.05 (a)", "5 um (c)"), a bare letter inside a sentence ("compared with B", "5 h"), a bare
letter out of sequence or not among the known labels ("h, hole" when c is next), a letter inside
another word or parenthesis ("p53", "IL-6", "(n = 3)", "(anti-CD34, E-H)"), "H & E".

Where the text goes (VERBATIM convention of ``data/real-figures/annotations.json``)
-----------------------------------------------------------------------------------
``subcaptions[label]`` joins with one space the caption pieces that apply to the label, in caption
order, label tokens kept:

* the panel's own fragment (from its label to the next label; a fragment cut before a label in
  mid-sentence loses its dangling "and" / ",");
* when labels start mid-sentence after an open phrase ("Distribution of sizes of (c) ... and
  (f) ..."), the start of that sentence goes to every label of the sentence;
* a later sentence of a fragment that names several panels, one of them outside the fragment
  ("... identical in a,d and in b,e"), also goes to the panels it names, with the unlabelled
  sentences right before it; a sentence that starts with another panel's label ("(A) Scale bar:
  100 um.") goes to that panel only;
* sentences after the last panel's own text go to the panels they name ("Scale bars, 1 nm (a),
  0.2 nm (c, d)"), or to every panel (``shared_trailing``) when they look shared: every other
  fragment is a single sentence, or they open with a cue ("Arrows indicate", "Scale bars =",
  "All", "These", ...) and are not footnotes ("*P < 0.05") nor of a kind every panel repeats
  ("Original magnification ..." after each panel). A sentence naming only panels of a last group
  is the group's ("(D-F) ... Arrows in E ...", "Scale bars, 1 cm (D) and 5 um (E, F)."); a note
  naming another panel ("(B) ... Arrow in A points to ...", "Results in A-C are ...") starts the
  shared part, while a description that refers back to an earlier panel ("(E) ... Mice in (A)
  were fasted ...") stays the last panel's own. A bare scale-bar value right after the last
  panel's text is its own when it is one bar ("(c) ... Scale bar, 5 nm.") or when the other
  panels note their own bars ("(1) ...; scale bar, 1 cm. (2, 3) ... Scale bars, 20 nm."), and is
  shared when plural after a single panel or after the last panel's notes ("... Arrows mark X.
  Scale bars, 1 mm."), where no other panel notes one. A marker note naming
  no panel ("Arrows indicate X.") is the last panel's when the other panels note their own
  markers, else shared on its own (which panels show such markers the caption leaves open: the
  miner keeps it for the panels whose images show them); the group's notes after it stay the
  group's, an unnamed sentence after it continues it;
* a panel without a fragment of its own that is named inline ("(a) ... compared with (b) ...")
  gets the sentences that name it.

The preamble (text before the first label) is not part of ``subcaptions``: it is
``CaptionSplit.preamble``. ``own_fragments[label]`` are the label's pieces as cut from the caption
(connectors kept), ``shared_trailing`` the pieces every label shares. ``to_prostate_convention``
gives the other convention (``data/caption-splitting/README.md``): preamble prepended, the
fragments' own label markers removed.

Captions without labels: with ``labels=None`` the result has ``subcaptions == {}`` and
``preamble == caption``; with labels, every label gets the whole caption as its subcaption
(``preamble == caption``, ``own_fragments`` empty). Labels of the hint that the caption never
names get the shared text only (possibly ""). Labels the caption names but the hint lacks are kept
under the caption's spelling, except labels after the last hinted one, which are read as text.
Keys use the hint's spelling when the hint prints the label in another case.

Cost: the regexes are linear (bounded, possessive repetitions, no nested unbounded quantifiers)
and the work on pathological input is capped (``_MAX_CANDIDATES`` label-like places of each
kind, ``_MAX_SENTENCES`` sentences): 100k-character captions, garbage included, took 20-120 ms
of CPU on a heavily loaded 2-core development machine (real captions take about 1 ms).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
import unicodedata
from dataclasses import dataclass

from p2p.mining.types import CaptionFragment, CaptionSplit

__all__ = [
    "MARKER_WORDS",
    "expand_label_expression",
    "find_marker_mentions",
    "normalize_label",
    "split_caption",
    "to_prostate_convention",
]

# --------------------------------------------------------------------------------------------
# Label tokens and expressions
# --------------------------------------------------------------------------------------------

_DASH_CHARS = "-\u2010\u2011\u2012\u2013\u2014\u2212"
_DASH = "[" + _DASH_CHARS + "]"
# Prime marks after a letter: "A'", "B" + U+2032 (prime), U+2019 (typeset apostrophe), U+02B9 /
# U+02BC (modifier letter prime / apostrophe), U+2033 / U+2034 (double / triple prime).
_PRIME_CHARS = "'\u2032\u2019\u02b9\u02bc\u2033\u2034"
_PRIME_COUNT = {"\u2033": 2, "\u2034": 3}
# One label token: "1a", "B1", "Aii" (a letter and its roman sub-panel), "A'" (primed), "iii",
# "A", "12". Never glued to other letters or digits.
_TOK = (
    r"(?<!\w)(?:\d{1,2}[A-Za-z]|[A-Za-z]\d{1,2}|[A-Z](?:i{1,3}|iv|vi{0,3}|ix|x)"
    r"|[A-Za-z][" + _PRIME_CHARS + r"]{1,3}|[ivxIVX]{2,5}|[A-Za-z]|\d{1,2})(?!\w)"
)
_SEP = (
    r"(?:\s{0,3},\s{0,3}(?:and\s{1,3}|&\s{0,3}|or\s{1,3})?"
    r"|\s{0,3}" + _DASH + r"\s{0,3}"
    r"|\s{1,3}(?:and|to|through|or|&)\s{1,3}"
    r"|\s{1,3}&\s{1,3}|\s{0,3}/\s{0,3})"
)
# Possessive repetitions: a failed match never backtracks into the list (linear scanning).
_EXPR = _TOK + r"(?:" + _SEP + _TOK + r"){0,9}"
_PTOK = r"(?:\(\s{0,3}" + _TOK + r"\s{0,3}\)|" + _TOK + r")"
_PEXPR = _PTOK + r"(?:" + _SEP + _PTOK + r"){0,9}+"

# "(A)", "(a,b)", "(D-F)", "((a), (b))", "(C, in red, 200*)" (labels, then a short comment).
_PAREN_RE = re.compile(
    r"[(\[]\s{0,3}(?:(?:[^()\[\];,]{1,40}[;,]\s{0,3})?(?:images?|panels?)\s{1,3})?(?P<expr>"
    + _PEXPR
    + r")\s{0,3}(?P<annot>[,;:]\s{0,3}[^()\[\]]{1,60}?)?[)\]]"
)
# After a parenthesised label: " and C)" or "-(C)" continue the same expression.
_PAREN_CONT_RE = re.compile(
    r"(?P<sep>" + _SEP + r")(?:\(\s{0,3}(?P<a>" + _EXPR + r")\s{0,3}\)|(?P<b>" + _EXPR + r")\))"
)
# Bare labels at a fragment start: "A. ", "A) ", "A and C: ", "A, ", "a Filtered", "b, c The".
_BARE_RE = re.compile(
    # Glued to a one-letter abbreviation ("s.d.", "e.g.") a letter is not a label "d." / "g.".
    # "Panel A:", "Panels B and C." name their labels with a word.
    r"(?:^|(?<=[;:!?,\n])\s{0,5}|(?<=\.)\s{1,5}|(?<=\.)(?<!\b[a-z]\.)|(?<=\))\s{1,5})"
    r"(?P<word>[Pp]anels?\s{1,3})?(?P<expr>" + _EXPR + r")(?P<term>\.(?=\s)|\)|:|,(?=\s)|(?=\s))"
)
# Work bounds for pathological input (real captions stay far below them).
_MAX_CANDIDATES = 500
_MAX_SENTENCES = 400
_MAX_SENTENCE_CHARS = 4000
# A single letter and a comma right before a position: "b,|e" continues a list of labels.
_LIST_BEFORE_RE = re.compile(r"(?<!\w)[A-Za-z]\s{0,2},\s{0,3}$")
_HALF_CLOSE_RE = re.compile(r"\)(?=\s{1,3}\S)")
_HALF_RE = re.compile(r"(?<=\s)(?P<expr>" + _EXPR + r")\)$")
_POSITION_WORD = (
    r"(?:[Tt]op|[Bb]ottom|[Uu]pper|[Ll]ower|[Mm]iddle|[Cc]ent(?:er|re)|[Ll]eft|[Rr]ight"
    r"|TOP|BOTTOM|UPPER|LOWER|LEFT|RIGHT)"
)
_POSITION = _POSITION_WORD + r"(?:[ " + _DASH_CHARS + r"]" + _POSITION_WORD + r")?"
_POSITION_TAIL = r"(?:\s{1,3}(?:[Pp]anels?|[Ii]mages?|[Rr]ows?|[Cc]olumns?|[Ii]nsets?|[Pp]arts?))?"
_POSITION_BARE_RE = re.compile(
    # Glued to a one-letter abbreviation ("s.d.", "e.g.") a letter is not a label "d." / "g.".
    r"(?:^|(?<=[;:!?,\n])\s{0,5}|(?<=\.)\s{1,5}|(?<=\.)(?<!\b[a-z]\.)|(?<=\))\s{1,5})(?P<expr>"
    + _POSITION
    + r")"
    + _POSITION_TAIL
    + r"(?P<term>\s{0,3}[:,.)]|\s{1,3}"
    + _DASH
    + r")"
)
_POSITION_PAREN_RE = re.compile(r"\(\s{0,3}(?P<expr>" + _POSITION + r")" + _POSITION_TAIL + r"\s{0,3}\)")
_TOKEN_RE = re.compile(_TOK)
_EXPR_RE = re.compile(_EXPR)
_REF_AFTER_RE = re.compile(r"\s{0,2}(?:[.,;:)]|and\b|$)")
_RANGE_WORD_RE = re.compile(r"\s{0,3}(?:" + _DASH + r"|to\b|through\b)\s{0,3}")

# Words right before a label that make it a reference, not a fragment start.
_REFERENCE_WORDS = frozenset(
    {"fig", "figs", "figure", "figures", "table", "tables", "suppl", "supplementary", "eq", "eqs"}
    | {"ref", "refs", "no", "nos", "vs", "versus", "cf", "see", "as", "than", "like", "e.g", "i.e", "al"}
)
# Reference words whose full stop is an abbreviation's ("Fig. 5b"), not a sentence end.
_REFERENCE_ABBREVIATIONS = frozenset(
    {"fig", "figs", "suppl", "eq", "eqs", "ref", "refs", "no", "nos", "vs", "cf", "e.g", "i.e", "al"}
)
_REFERENCE_PAIRS = frozenset(
    {
        ("compared", "with"),
        ("compared", "to"),
        ("similar", "to"),
        ("relative", "to"),
        ("same", "as"),
        ("as", "in"),
    }
)
_LAST_WORDS_RE = re.compile(r"([A-Za-z][A-Za-z.]*)?\s*([A-Za-z][A-Za-z.]*)\.?\s{0,3}$")


def _is_reference_context(text: str, pos: int) -> bool:
    """Whether the words right before ``pos`` make a label there a reference ("Fig. 5b", "as in")."""
    pre = text[max(0, pos - 30) : pos].rstrip()
    if not pre:
        return False
    if pre[-1] in "<>=\u2264\u2265":
        return True
    m = _LAST_WORDS_RE.search(pre[-30:] + " ")
    if not m:
        return False
    last = m.group(2).lower().rstrip(".")
    if pre.endswith(".") and last not in _REFERENCE_ABBREVIATIONS:
        return False  # "... of the figure. (A) ...": a sentence ended, a new one starts
    before = (m.group(1) or "").lower().rstrip(".")
    return last in _REFERENCE_WORDS or (before, last) in _REFERENCE_PAIRS


# A number (with a short unit) right before "(a)": a footnote or a scale, "P < 0.05 (a)", "5 μm (c)".
_UNIT = (
    r"(?:%|\u00b0C?|[nu\u00b5\u03bcmck]?m|[nu\u00b5\u03bcm]?[MlLg]|kDa|kb|bp|[mu\u00b5\u03bc]?s|min|h|hr|hrs|d|days?|"
    r"wks?|weeks?|[xX\u00d7]|[mk]?[AV]|Gy|rpm)(?:[\u2212-]\d)?"
)
_NUMBER_BEFORE_RE = re.compile(
    r"(?<![\w.\u2212-])\d+(?:[.,]\d+)*\s{0,2}(?:" + _UNIT + r"(?:\s{1,2}" + _UNIT + r")?)?\s{0,3}$"
)
# Words whose full stop does not end a sentence.
_ABBREVIATIONS = frozenset(
    {"fig", "figs", "e.g", "i.e", "vs", "al", "approx", "ca", "no", "nos", "cf", "resp", "dr", "mr", "ms"}
    | {"st", "inc", "ltd", "co", "ref", "refs", "eq", "eqs", "sp", "spp", "var", "subsp", "min", "max"}
)

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_ROMAN_UNITS = ("", "i", "ii", "iii", "iv", "v", "vi", "vii", "viii", "ix")
_ROMAN_TENS = ("", "x", "xx", "xxx")
_ROMAN_VALUE = {_ROMAN_TENS[t] + _ROMAN_UNITS[u]: 10 * t + u for t in range(4) for u in range(10)}
del _ROMAN_VALUE[""]
_ROMAN_OF = {v: k for k, v in _ROMAN_VALUE.items()}

# Key of a label: (system, major, minor). Systems: 0 letters (minor = digit of "B1", numeral of
# "Bii", or _PRIME_MINOR per prime of "B'"), 1 roman numerals, 2 numbers (minor = letter of "1a"),
# 3 position words.
Key = tuple[int, int, int]
_PRIME_MINOR = 100
_LETTER_ROMAN_RE = re.compile(r"([A-Z])(i{1,3}|iv|vi{0,3}|ix|x)")
_LETTER_PRIME_RE = re.compile(r"([A-Za-z])([" + _PRIME_CHARS + r"]{1,3})")


def _prime_count(marks: str) -> int:
    return sum(_PRIME_COUNT.get(ch, 1) for ch in marks)


def normalize_label(token: str) -> str:
    """A label as printed, without brackets, punctuation and spacing: "(a)" -> "a", "B." -> "B".

    Case is kept ("A" and "a" are different prints). Full-width and other compatibility forms
    are folded (NFKC), dashes become "-", inner spaces of expressions are dropped
    ("(B, C)" -> "B,C"). Position words are lower-cased without "panel": "Left panel:" -> "left".
    """
    text = unicodedata.normalize("NFKC", token or "").strip()
    for ch in _DASH_CHARS:
        text = text.replace(ch, "-")
    text = text.strip(" \t\r\n.,;:()[]{}")
    position = re.fullmatch(r"(?i)(" + _POSITION + r")" + _POSITION_TAIL, text)
    if position:
        return re.sub(r"[\s-]+", " ", position.group(1).lower())
    text = re.sub(r"\s*,\s*", ",", text)
    text = re.sub(r"\s*-\s*", "-", text)
    return re.sub(r"\s+", " ", text)


def _parse_token(token: str, roman: bool) -> Key | None:
    """Key of one label token; None when it is not a label."""
    if token.isdigit():
        value = int(token)
        return (2, value, 0) if 0 < value < 100 else None
    if len(token) == 1 and token.isalpha():
        low = token.lower()
        if roman and low in "ivx":
            return (1, _ROMAN_VALUE[low], 0)
        if low in _LETTERS:
            return (0, _LETTERS.index(low), 0)
        return None
    m = re.fullmatch(r"(\d{1,2})([A-Za-z])", token)
    if m:
        return (2, int(m.group(1)), _LETTERS.index(m.group(2).lower()) + 1)
    m = re.fullmatch(r"([A-Za-z])(\d{1,2})", token)
    if m:
        return (0, _LETTERS.index(m.group(1).lower()), int(m.group(2)))
    m = _LETTER_ROMAN_RE.fullmatch(token)
    if m:
        return (0, _LETTERS.index(m.group(1).lower()), _ROMAN_VALUE[m.group(2)])
    m = _LETTER_PRIME_RE.fullmatch(token)
    if m:
        count = _prime_count(m.group(2))
        return (0, _LETTERS.index(m.group(1).lower()), _PRIME_MINOR * count) if count <= 3 else None
    low = token.lower()
    if low in _ROMAN_VALUE and (token.islower() or token.isupper()):
        return (1, _ROMAN_VALUE[low], 0)
    return None


def _label_text(key: Key, like: str) -> str:
    """Print a key in the style of ``like`` (case, roman/letter)."""
    system, major, minor = key
    upper = like[:1].isupper() or (like[-1:].isupper() and not like[-1:].isdigit())
    if system == 0:
        letter = _LETTERS[major].upper() if like[:1].isupper() else _LETTERS[major]
        if minor >= _PRIME_MINOR:
            mark = like[-1] if like[-1:] in _PRIME_CHARS[:5] else "'"
            return letter + mark * (minor // _PRIME_MINOR)
        if minor and _LETTER_ROMAN_RE.fullmatch(like):
            return letter + _ROMAN_OF[minor]
        return letter + (str(minor) if minor else "")
    if system == 1:
        text = _ROMAN_OF.get(major, str(major))
        return text.upper() if upper else text
    if minor:
        letter = _LETTERS[minor - 1]
        return f"{major}{letter.upper() if like[-1:].isupper() else letter}"
    return str(major)


@functools.lru_cache(maxsize=4096)
def _expand(expr: str, roman: bool) -> tuple[tuple[str, Key], ...]:
    """Labels of an expression as (text, key); () when it is not a valid label expression."""
    pieces: list[tuple[str, Key]] = []
    pending_range = False
    pos = 0
    for m in _TOKEN_RE.finditer(expr):
        between = expr[pos : m.start()]
        pos = m.end()
        token = m.group(0)
        short = _short_member(pieces[-1] if pieces else None, token)
        if short is not None:
            token, key = short
        else:
            parsed = _parse_token(token, roman)
            if parsed is None:
                return ()
            key = parsed
        if pieces and _RANGE_WORD_RE.fullmatch(re.sub(r"[()\[\]]", "", between)):
            pending_range = True
        if pending_range:
            first_text, first_key = pieces[-1]
            if first_key[0] != key[0] or key <= first_key:
                return ()
            if first_key[0] == 0 and first_key[2] == 0 and key[2] == 0:
                if token.isupper() != first_text.isupper():
                    return ()
                keys = [(0, i, 0) for i in range(first_key[1] + 1, key[1] + 1)]
            elif first_key[0] in (1, 2) and first_key[2] == 0 and key[2] == 0:
                keys = [(first_key[0], i, 0) for i in range(first_key[1] + 1, key[1] + 1)]
            elif first_key[0] == 0 and first_key[2] == key[2] >= _PRIME_MINOR:
                # "A'-C'": primed letters
                keys = [(0, i, key[2]) for i in range(first_key[1] + 1, key[1] + 1)]
            elif first_key[1] == key[1] or (first_key[0] == 0 and first_key[2] and key[2]):
                # "B1-B3", "1a-1c": same major, minor range
                if first_key[1] != key[1]:
                    return ()
                keys = [(key[0], key[1], i) for i in range(first_key[2] + 1, key[2] + 1)]
            else:
                return ()
            if len(keys) > 60:
                return ()
            pieces.extend((_label_text(k, first_text), k) for k in keys[:-1])
            pieces.append((token, key))
            pending_range = False
            continue
        if pieces and key <= pieces[-1][1] and not (key[2] >= _PRIME_MINOR > pieces[-1][1][2]):
            # lists go up: "H & E" is a stain, not panels H and E ("A-C, A'-C'" starts the primes)
            return ()
        pieces.append((token, key))
    if not pieces:
        return ()
    seen: set[Key] = set()
    out: list[tuple[str, Key]] = []
    for text, key in pieces:
        if key not in seen:
            seen.add(key)
            out.append((text, key))
    return tuple(out)


def _short_member(previous: tuple[str, Key] | None, token: str) -> tuple[str, Key] | None:
    """A sub-panel written without its letter after one written in full: "A1-3" is A1 to A3,
    "(Ai, ii)" is Ai and Aii, "c1-6" is c1 to c6. (text, key) of it, or None."""
    if previous is None:
        return None
    text, key = previous
    if key[0] != 0 or not 0 < key[2] < _PRIME_MINOR:
        return None
    if _LETTER_ROMAN_RE.fullmatch(text):
        value = _ROMAN_VALUE.get(token) if token.islower() else None
    else:
        value = int(token) if token.isdigit() else None
    if not value:
        return None
    return text[0] + token, (0, key[1], value)


def _roman_wanted(expr: str, hint_roman: bool | None) -> bool:
    if hint_roman is not None:
        return hint_roman
    tokens = [t.lower() for t in _TOKEN_RE.findall(expr)]
    if any(len(t) > 1 and t in _ROMAN_VALUE for t in tokens):
        return True
    return bool(tokens) and tokens[0] == "i" and all(t in _ROMAN_VALUE for t in tokens)


def _encloses(text: str) -> bool:
    """Whether the first bracket of ``text`` closes at its last character."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth == 0:
                return i == len(text) - 1
    return False


def expand_label_expression(expression: str, roman: bool | None = None) -> list[str]:
    """Labels an expression names: "B-D" -> ["B","C","D"], "(a,b)" -> ["a","b"], "ii-iv" -> roman.

    Handles brackets, lists (",", "and", "&", "or", "/"), ranges ("-", en/em dash, "to",
    "through"), "((a), (b))", compound labels ("1a-1c", "B1-B3") and position words
    ("Left panel" -> ["left"]). ``roman`` forces (True) or forbids (False) reading i/v/x as roman
    numerals; by default a range or list is roman when it has a multi-letter numeral ("ii") or
    starts at "i" with numerals only. Returns [] for anything that is not a label expression
    (reversed or mixed-case ranges, words, empty).
    """
    text = unicodedata.normalize("NFKC", expression or "").strip()
    text = text.strip(" \t\r\n.;:")
    position = normalize_label(text)
    if re.fullmatch(_POSITION, position):
        return [position]
    inner = text
    while len(inner) >= 2 and inner[0] in "([" and inner[-1] in ")]" and _encloses(inner):
        inner = inner[1:-1].strip()
    if not inner or not re.fullmatch(_PEXPR, inner):
        return []
    return [t for t, _ in _expand(inner, _roman_wanted(inner, roman))]


# --------------------------------------------------------------------------------------------
# Marker mentions
# --------------------------------------------------------------------------------------------

# Canonical marker words and the words that mention them ("boxed" is a box, "oval" a circle).
MARKER_WORDS: dict[str, tuple[str, ...]] = {
    "arrowhead": ("arrowhead", "arrowheads", "arrow head", "arrow heads", "arrow-head", "arrow-heads"),
    "arrow": ("arrow", "arrows"),
    "asterisk": ("asterisk", "asterisks"),
    "star": ("star", "stars"),
    "box": ("box", "boxes", "boxed"),
    "inset": ("inset", "insets", "insert", "inserts"),
    "circle": ("circle", "circles", "circled", "oval", "ovals"),
    "dashed line": ("dashed line", "dashed lines", "broken line", "broken lines"),
    "outlined": ("outline", "outlines", "outlined"),
    "dotted": ("dotted",),
    "square": ("square", "squares"),
}
# Matched on lower-cased text (case-insensitive regexes are several times slower).
_MARKER_RE = re.compile(
    r"\b(?:a(?:rrow(?:[\s-]?heads?|s)?|sterisks?)|stars?|box(?:es|ed)?|ins(?:et|ert)s?|circle[sd]?|ovals?"
    r"|(?:dashed|broken)[\s-]+lines?|outline[sd]?|dotted|squares?)\b"
)


def _marker_kind(word: str) -> str:
    if word.startswith("arrow"):
        return "arrowhead" if "head" in word else "arrow"
    if word.startswith(("dashed", "broken")):
        return "dashed line"
    for kind, words in MARKER_WORDS.items():
        if word in words:
            return kind
    return word


def find_marker_mentions(text: str) -> tuple[str, ...]:
    """Canonical marker words in ``text``, first-mention order: ("arrow", "box", ...)."""
    found: list[str] = []
    for m in _MARKER_RE.finditer((text or "").lower()):
        kind = _marker_kind(m.group(0))
        if kind not in found:
            found.append(kind)
    return tuple(found)


# --------------------------------------------------------------------------------------------
# Sentences
# --------------------------------------------------------------------------------------------

_SENTENCE_END_RE = re.compile(r"[.!?](?=[\s\u00a0]{1,5}[^\sa-z]|[\s\u00a0]*$)")


def _sentence_starts(text: str, lo: int, hi: int, protected: list[tuple[int, int]]) -> list[int]:
    """Positions in [lo, hi) where a new sentence starts (after ". " + non-lowercase)."""
    starts: list[int] = []
    pi = 0
    for m in _SENTENCE_END_RE.finditer(text, lo, hi):
        dot = m.start()
        while pi < len(protected) and protected[pi][1] <= dot:
            pi += 1
        if pi < len(protected) and protected[pi][0] <= dot < protected[pi][1]:
            continue
        if text[dot] == ".":
            word = re.search(r"([A-Za-z][A-Za-z.]{0,8})$", text[max(lo, dot - 10) : dot])
            if word and word.group(1).lower() in _ABBREVIATIONS:
                continue
            if dot > 0 and text[dot - 1].isdigit() and dot + 1 < hi and text[dot + 1].isdigit():
                continue
        nxt = m.end()
        while nxt < hi and text[nxt].isspace():
            nxt += 1
        if nxt < hi:
            starts.append(nxt)
            if len(starts) >= _MAX_SENTENCES:
                break  # the rest counts as one sentence
    return starts


def _split_sentences(text: str) -> list[str]:
    starts = [0, *_sentence_starts(text, 0, len(text), []), len(text)]
    return [text[a:b].strip() for a, b in itertools.pairwise(starts) if text[a:b].strip()]


# --------------------------------------------------------------------------------------------
# Candidates and their selection
# --------------------------------------------------------------------------------------------


@dataclass
class _Candidate:
    start: int
    end: int  # end of the marker (closing bracket / terminator)
    expr: str
    form: str  # paren, half, dot, colon, comma, space, position
    boundary: str  # "sentence" (start, after . ; : ! ?), "comma" or "inner"
    follower: str  # "text", "punct" or "end"
    blocked: bool
    after_number: bool = False


@dataclass
class _Split:
    labels: list[str]  # output keys
    keys: list[Key]
    start: int
    end: int  # marker end
    refinement: bool = False
    post: bool = False


def _boundary_kind(text: str, pos: int) -> str:
    i = pos - 1
    while i >= 0 and text[i].isspace() and pos - i < 8:
        i -= 1
    if i < 0:
        return "sentence"
    ch = text[i]
    if ch in ".;:!?\n":
        return "sentence"
    if ch == "," or (ch == ")" and i < pos - 1):
        return "comma"  # after a comma, or after a closing parenthesis and a space
    return "inner"


_CONJUNCTION_RE = re.compile(
    r"(?:and|or|but|while|whereas|respectively|as\s+well\s+as|vs\.?|versus)\b", re.IGNORECASE
)


def _follower_kind(text: str, pos: int) -> str:
    """What follows a label: "end", "punct" (.,;:)), "conj" (and, or, ...) or "text"."""
    i = pos
    n = len(text)
    while i < n and text[i].isspace() and i - pos < 8:
        i += 1
    if i >= n:
        return "end"
    if text[i] in ".,;:)]":
        return "punct"
    return "conj" if _CONJUNCTION_RE.match(text, i) else "text"


def _find_candidates(text: str) -> list[_Candidate]:
    """Every place that could be a panel label, at most ``_MAX_CANDIDATES`` of each kind."""
    cands: list[_Candidate] = []
    taken_until = -1
    for m in _PAREN_RE.finditer(text):
        start, end, expr = m.start(), m.end(), m.group("expr")
        if start < taken_until:
            continue
        if len(cands) >= _MAX_CANDIDATES:
            break
        # "(B) and C)", "(A)-(C)", "(A) and (B)" continue the expression.
        while _expand(expr, False) or _expand(expr, True):
            cont = _PAREN_CONT_RE.match(text, end)
            if not cont:
                break
            merged = expr + cont.group("sep") + (cont.group("a") or cont.group("b"))
            if not (_expand(merged, False) or _expand(merged, True)):
                break
            expr, end = merged, cont.end()
        taken_until = end
        cands.append(
            _Candidate(
                start=start,
                end=end,
                expr=expr,
                form="paren",
                boundary=_boundary_kind(text, start),
                follower=_follower_kind(text, end),
                blocked=_is_reference_context(text, start),
                after_number=bool(_NUMBER_BEFORE_RE.search(text, max(0, start - 24), start)),
            )
        )
    paren_spans = [(c.start, c.end) for c in cands]

    def in_paren(pos: int, state: list[int]) -> bool:
        while state[0] < len(paren_spans) and paren_spans[state[0]][1] <= pos:
            state[0] += 1
        return state[0] < len(paren_spans) and paren_spans[state[0]][0] <= pos

    # "... derived from F) normal bladder, G) grade II": half-bracketed labels inside a sentence.
    state = [0]
    opened = _OpenParens(text)
    found = 0
    for close in _HALF_CLOSE_RE.finditer(text):
        found += 1
        if found > 2 * _MAX_CANDIDATES:
            break
        if in_paren(close.start(), state):
            continue
        half = _HALF_RE.search(text, max(0, close.start() - 60), close.end())
        if not half or opened.inside(half.start()):
            continue
        cands.append(
            _Candidate(
                start=half.start(),
                end=half.end(),
                expr=half.group("expr"),
                form="half",
                boundary=_boundary_kind(text, half.start()),
                follower=_follower_kind(text, half.end()),
                blocked=_is_reference_context(text, half.start()),
            )
        )
    # Bare labels where a sentence or clause starts: "A. ", "a Filtered", "b, c The", "A and C: ".
    state = [0]
    opened = _OpenParens(text)
    found = 0
    for m in _BARE_RE.finditer(text):
        found += 1
        if found > 2 * _MAX_CANDIDATES:
            break
        pos, end = m.start("word" if m.group("word") else "expr"), m.end()
        if in_paren(pos, state):
            continue
        term = m.group("term")
        form = {".": "dot", ")": "half", ":": "colon", ",": "comma"}.get(term, "space")
        if form == "half" and (opened.inside(pos) or m.group("word")):
            continue  # "(anti-CD34, E-H)": the end of a parenthesis
        if _boundary_kind(text, pos) == "comma" and _LIST_BEFORE_RE.search(text, max(0, pos - 8), pos):
            continue  # "identical in b,e. Next": the end of a list of labels, not a new label
        if form == "space":
            # "a Filtered", "a *10": the next word must not be a lower-case word ("A mouse"),
            # unless a word names the label ("Panel B shows ...").
            nxt = _skip_spaces(text, end)
            if nxt >= len(text) or (text[nxt].islower() and not m.group("word")):
                continue
            if not text[nxt].isupper() and _boundary_kind(text, pos) == "comma":
                continue  # ", a 4-mm metastasis": an article
        cands.append(
            _Candidate(
                start=pos,
                end=end,
                expr=m.group("expr"),
                form=form,
                boundary=_boundary_kind(text, pos),
                follower=_follower_kind(text, end),
                blocked=_is_reference_context(text, pos),
            )
        )
    cands.sort(key=lambda c: c.start)
    unique: list[_Candidate] = []
    for c in cands:
        if unique and unique[-1].start == c.start:
            continue
        unique.append(c)
    return unique


class _OpenParens:
    """Answers, for increasing positions, whether a parenthesis opened in the same clause is still
    open there ("(anti-CD34, E-H)": E-H is inside). One pass over the text in all."""

    _TOKENS = re.compile(r"[()]|[.;](?=\s)")

    def __init__(self, text: str) -> None:
        self._tokens = self._TOKENS.finditer(text)
        self._next = next(self._tokens, None)
        self._depth = 0

    def inside(self, pos: int) -> bool:
        while self._next is not None and self._next.start() < pos:
            ch = self._next.group(0)
            if ch == "(":
                self._depth += 1
            elif ch == ")":
                self._depth = max(0, self._depth - 1)
            else:
                self._depth = 0
            self._next = next(self._tokens, None)
        return self._depth > 0


def _find_position_candidates(text: str) -> list[_Candidate]:
    cands: list[_Candidate] = []
    for m in _POSITION_PAREN_RE.finditer(text):
        if len(cands) >= _MAX_CANDIDATES:
            break
        cands.append(
            _Candidate(
                start=m.start(),
                end=m.end(),
                expr=m.group("expr"),
                form="paren",
                boundary=_boundary_kind(text, m.start()),
                follower=_follower_kind(text, m.end()),
                blocked=False,
            )
        )
    for m in _POSITION_BARE_RE.finditer(text):
        if len(cands) >= 2 * _MAX_CANDIDATES:
            break
        pos = m.start("expr")
        cands.append(
            _Candidate(
                start=pos,
                end=m.end(),
                expr=m.group("expr"),
                form="position",
                boundary=_boundary_kind(text, pos),
                follower="text",
                blocked=False,
            )
        )
    cands.sort(key=lambda c: c.start)
    return cands


@dataclass
class _Hint:
    keys: dict[Key, str]  # key -> hint spelling
    roman: bool | None
    positions: dict[str, str]  # canonical position -> hint spelling


_POSITION_SYNONYMS = {"upper": "top", "lower": "bottom", "centre": "center"}


def _canonical_position(label: str) -> str:
    return " ".join(_POSITION_SYNONYMS.get(w, w) for w in normalize_label(label).split())


def _make_hint(labels: list[str] | None) -> _Hint | None:
    if labels is None:
        return None
    normalized = [normalize_label(lab) for lab in labels if lab and normalize_label(lab)]
    lows = {lab.lower() for lab in normalized}
    roman: bool | None = None
    if any(len(low) > 1 and low in _ROMAN_VALUE for low in lows):
        roman = True
    elif lows & {"h", "j", "k", "b"}:
        roman = False
    keys: dict[Key, str] = {}
    positions: dict[str, str] = {}
    for lab, original in zip(
        normalized, [lab for lab in labels if lab and normalize_label(lab)], strict=False
    ):
        if re.fullmatch(_POSITION, lab):
            positions[_canonical_position(lab)] = original
            continue
        key = _parse_token(lab, bool(roman))
        if key is not None and key not in keys:
            keys[key] = original
    return _Hint(keys=keys, roman=roman, positions=positions)


def _decide_roman(cands: list[_Candidate], hint: _Hint | None) -> bool:
    if hint is not None and hint.roman is not None:
        return hint.roman
    tokens: set[str] = set()
    for c in cands:
        if c.form == "paren" or c.boundary == "sentence":
            tokens.update(t.lower() for t in _TOKEN_RE.findall(c.expr))
    multi = {t for t in tokens if len(t) > 1 and t in _ROMAN_VALUE}
    if tokens & {"b", "c", "d"}:
        return False
    # "(i-v) Confocal images ...": a range from i is counted in roman numerals.
    from_i = any(
        _ROMAN_RANGE_RE.match(c.expr) for c in cands if c.form == "paren" or c.boundary == "sentence"
    )
    return "i" in tokens and (bool(multi & {"ii", "iii", "iv"}) or from_i)


_ROMAN_RANGE_RE = re.compile(r"\s*i\s*" + _DASH + r"\s*(?:ii|iii|iv|v|vi|vii|viii|ix|x)\s*$", re.IGNORECASE)


def _gap(key: Key, last: Key | None, covered: set[Key], universe: list[Key]) -> int:
    """How many labels of the universe lie between the last split and ``key``, not yet described."""
    gap = 0
    for u in universe:
        if u >= key:
            break
        if (last is None or u > last) and u not in covered:
            gap += 1
    return gap


def _base_universe(system: int) -> list[Key]:
    if system == 0:
        return [(0, i, 0) for i in range(26)]
    if system == 1:
        return [(1, i, 0) for i in range(1, 40)]
    return [(2, i, 0) for i in range(1, 100)]


_NOTE_AFTER_RE = re.compile(r"\s{0,2}\([^()]{1,60}\)")


def _select(
    text: str, cands: list[_Candidate], hint: _Hint | None, roman: bool, post_mode: bool
) -> list[_Split]:
    """Pick the candidates that start (pre mode) or end (post mode) panel fragments.

    Post mode also keeps labels that clearly start a sentence ("(a) An overview. ... cells (b).").
    """
    splits: list[_Split] = []
    covered: set[Key] = set()
    last: Key | None = None
    last_form = ""
    system: int | None = None
    upper: bool | None = None
    groups: list[_Split] = []
    refined: set[Key] = set()
    hint_max: Key | None = max(hint.keys) if hint is not None and hint.keys else None
    number_run = _bare_number_run(cands)
    for cand in cands:
        if cand.blocked or (cand.after_number and not post_mode):
            continue
        labels = (groups and _members_by_number(cand.expr, groups[-1])) or _expand(cand.expr, roman)
        if not labels:
            continue
        if hint is not None and hint.keys:
            labels = _members_for_groups(labels, hint)
        keys = [k for _, k in labels]
        if len({k[0] for k in keys}) != 1:
            continue
        if system is not None and keys[0][0] != system:
            continue
        if hint_max is not None and keys[0][0] == hint_max[0] and max(keys) > hint_max:
            continue  # after the last known panel: text, not a label
        letters = [t for t, k in labels if k[0] in (0, 1)]
        if letters and upper is not None and letters[0][:1].isupper() != upper:
            continue
        in_hint = hint is not None and bool(hint.keys) and all(k in hint.keys for k in keys)
        if not in_hint and hint is not None and _part_of_whole(keys, hint):
            continue  # "(a) ... (a1-a3) Close-ups ...": more of a's text
        if not in_hint and not _roman_members_ok(labels, hint, covered):
            continue  # "(Bv)" is a blood vessel, not sub-panel v of B
        if (
            hint is not None
            and hint.keys
            and cand.form != "paren"
            and not in_hint
            and not _unread_in_run(cand, keys, last, last_form, hint, covered)
        ):
            continue
        if (
            system is None
            and keys[0][0] == 2
            and not in_hint
            and cand.form != "paren"
            and keys[0][2] == 0
            and not number_run
        ):
            continue  # bare numbers start sentences too often (a figure number and letter do not)
        leading = (
            cand.boundary in ("sentence", "comma") and cand.follower == "text" and cand.form != "position"
        )
        trailing = post_mode and cand.form == "paren" and cand.boundary != "sentence"
        if any(k in covered for k in keys):
            # "(A-B) ... (A) ... (B)": members of an earlier group, in order.
            group = next((g for g in reversed(groups) if all(k in g.keys for k in keys)), None)
            if group is None or any(k in refined for k in keys):
                continue
            if len(keys) >= len(group.keys) and not (leading and cand.boundary == "sentence"):
                continue  # a restated group ("D-F: ...") only where a sentence starts with it
            done = [k for k in group.keys if k in refined]
            if done and min(keys) < max(done):
                continue
            if not ((leading and cand.form in ("paren", "half", "dot", "colon")) or trailing):
                continue
            if leading and cand.boundary == "comma" and not done:
                continue  # "(a-c) Cells in (a) control, (b) drug and (c) both.": references
            refined.update(keys)
            splits.append(
                _Split(
                    labels=[t for t, _ in labels],
                    keys=keys,
                    start=cand.start,
                    end=cand.end,
                    refinement=True,
                    post=not leading,
                )
            )
            continue
        if in_hint and hint is not None:
            universe = sorted(hint.keys)
        elif keys[0][0] == 2 and min(keys)[2] > 0:
            # "6a", "6b"...: the figure number is no panel count, the letters are
            universe = [(2, min(keys)[1], m) for m in range(1, 27)]
        else:
            universe = _base_universe(keys[0][0])
        gap = _gap(min(keys), last, covered, universe)
        is_post = False
        if post_mode and not leading:
            ok = trailing and gap <= 1 and (bool(splits) or cand.follower != "text")
            is_post = True
        elif cand.form == "paren":
            ok = gap <= 3 if cand.boundary == "sentence" else (gap <= 1 and cand.follower == "text")
        elif cand.form == "half" and cand.boundary in ("comma", "inner"):
            ok = gap == 0 and cand.follower == "text"
        elif cand.boundary == "sentence" and cand.form in ("dot", "half", "colon"):
            ok = gap <= 1
        elif cand.boundary in ("sentence", "comma") and cand.form in (
            "dot",
            "half",
            "colon",
            "space",
            "comma",
        ):
            ok = gap == 0
        else:
            ok = False
        if not ok:
            continue
        if system is None:
            system = keys[0][0]
        if letters and upper is None:
            upper = letters[0][:1].isupper()
        covered.update(keys)
        last = max(keys)
        last_form = cand.form
        end = cand.end
        if is_post:
            # "... glands (v) (black arrows), with ...": the note after the label is the panel's.
            note = _NOTE_AFTER_RE.match(text, end)
            if note and not _PAREN_RE.fullmatch(note.group(0).strip()):
                end = note.end()
        split = _Split(labels=[t for t, _ in labels], keys=keys, start=cand.start, end=end, post=is_post)
        splits.append(split)
        if len(keys) > 1:
            groups.append(split)
    return splits


def _members_of(key: Key, keys: dict[Key, str] | set[Key]) -> list[Key]:
    """The sub-panels ("c1", "Cii", "C'") among ``keys`` of a plain label ("c")."""
    if key[2] or key[0] not in (0, 2):
        return []
    return sorted(k for k in keys if k[0] == key[0] and k[1] == key[1] and k[2])


def _members_for_groups(labels: tuple[tuple[str, Key], ...], hint: _Hint) -> tuple[tuple[str, Key], ...]:
    """A plain label the hint lacks whose sub-panels it has ("(c) Sections ... (c1-c6) ..." with
    panels c1 to c6) names the group of them: "c" stands for c1 ... c6."""
    if all(key in hint.keys for _, key in labels):
        return labels
    out: list[tuple[str, Key]] = []
    for text, key in labels:
        members = _members_of(key, hint.keys) if key not in hint.keys else []
        named = [(hint.keys[m], m) for m in members] or [(text, key)]
        out.extend(item for item in named if all(item[1] != k for _, k in out))
    return tuple(out)


def _members_by_number(expr: str, group: _Split) -> tuple[tuple[str, Key], ...]:
    """Members of the last group named by their numbers alone: "(A) Sections. (i) CA1. (ii) CA3."
    with panels Ai and Aii (or "(A1-A3) ... (1) ... (2) ..."). () when ``expr`` is not that."""
    texts = group.labels
    if len({k[1] for k in group.keys}) != 1 or any(
        k[0] != 0 or not 0 < k[2] < _PRIME_MINOR for k in group.keys
    ):
        return ()
    letter_roman = all(_LETTER_ROMAN_RE.fullmatch(t) for t in texts)
    if not letter_roman and not all(re.fullmatch(r"[A-Za-z]\d{1,2}", t) for t in texts):
        return ()
    tokens = _TOKEN_RE.findall(expr)
    if not tokens or not all((t in _ROMAN_VALUE) if letter_roman else t.isdigit() for t in tokens):
        return ()
    named = _expand(expr, letter_roman)
    major = group.keys[0][1]
    by_minor = {k[2]: t for t, k in zip(texts, group.keys, strict=False)}
    out = tuple((by_minor[k[1]], (0, major, k[1])) for _, k in named if k[1] in by_minor)
    return out if len(out) == len(named) else ()


def _parent_of(key: Key, keys: dict[Key, str] | set[Key]) -> Key | None:
    """The plain label among ``keys`` of a sub-panel ("a" of "a2") when ``keys`` has none of its
    sub-panels (the panel is "a" as a whole)."""
    if key[0] not in (0, 2) or not key[2]:
        return None
    parent = (key[0], key[1], 0)
    return parent if parent in keys and not _members_of(parent, keys) else None


def _part_of_whole(keys: list[Key], hint: _Hint) -> bool:
    """Sub-panels the hint lacks of panels it has whole: after that panel's own text part of it
    ("(a) ... (a1-a3) Close-ups ..." with panels a, b, c), before it an abbreviation ("Comedo
    type PCa (G5). G. ..."); never a fragment start of their own."""
    return all(key not in hint.keys and _parent_of(key, hint.keys) is not None for key in keys)


def _roman_members_ok(labels: tuple[tuple[str, Key], ...], hint: _Hint | None, covered: set[Key]) -> bool:
    """Letter+roman labels ("Aii") the hint does not name: none when there is a hint, else only
    a series counted from "i" ("(Ai) ... (Aii)", "(Bi-Biii)"): "(Bv)" is an abbreviation."""
    for text, key in labels:
        if key[0] != 0 or not key[2] or not _LETTER_ROMAN_RE.fullmatch(text):
            continue
        if hint is not None and hint.keys and key not in hint.keys:
            return False
        first = (0, key[1], 1)
        if key != first and first not in covered and first not in {k for _, k in labels}:
            return False
    return True


def _bare_number_run(cands: list[_Candidate]) -> bool:
    """Bare numbers that count the panels from 1 at sentence starts ("1, Overview. 2, Plot of
    ...", "1, 2, IHC images ... 3, ..."), written alike: labels, not numbers starting sentences."""
    numbers: list[int] = []
    forms: set[str] = set()
    for c in cands:
        if (
            c.blocked
            or c.after_number
            or c.form == "paren"
            or c.boundary != "sentence"
            or c.follower != "text"
        ):
            continue
        keys = [k for _, k in _expand(c.expr, False)]
        if keys and all(k[0] == 2 and k[2] == 0 for k in keys):
            numbers.extend(k[1] for k in keys)
            forms.add(c.form)
    return len(forms) == 1 and len(numbers) >= 2 and numbers == list(range(1, len(numbers) + 1))


def _unread_in_run(
    cand: _Candidate, keys: list[Key], last: Key | None, last_form: str, hint: _Hint, covered: set[Key]
) -> bool:
    """A bare label the hint lacks that is one all the same: "4, Overview. 5, Overview. 6, ..."
    read as 4 and 6 (OCR missed 5): right after the last label and right before the next hinted
    one, at a sentence start and written as the label before it."""
    if len(keys) != 1 or last is None or keys[0][0] != last[0] or last_form != cand.form:
        return False
    if cand.boundary != "sentence" or cand.follower != "text":
        return False
    key = keys[0]
    universe = _base_universe(key[0])
    after = [k for k in hint.keys if k[0] == key[0] and k > key]
    return (
        bool(after)
        and _gap(key, last, covered, universe) == 0
        and _gap(min(after), key, covered | {key}, universe) == 0
    )


def _select_positions(cands: list[_Candidate], post_mode: bool) -> list[_Split]:
    splits: list[_Split] = []
    seen: set[str] = set()
    for cand in cands:
        label = _canonical_position(cand.expr)
        if label in seen:
            continue
        if post_mode:
            if cand.form != "paren" or cand.boundary == "sentence":
                continue
        elif cand.boundary != "sentence":
            continue
        seen.add(label)
        key: Key = (3, len(splits), 0)
        splits.append(_Split(labels=[label], keys=[key], start=cand.start, end=cand.end, post=post_mode))
    return splits


# --------------------------------------------------------------------------------------------
# Distribution of text to labels
# --------------------------------------------------------------------------------------------

# A sentence after the last panel's description that describes every panel.
_SHARED_START_RE = re.compile(
    r"^[\W_]{0,3}(?:scale\s*bar\s+(?:represents?|indicates?|is)|scale\s*bars?\s*=|bars\b|"
    r"original\s+magnifications\b|arrows\b|arrowheads|arrow\s*heads|asterisks|stars\b|insets\b|"
    r"boxes\b|boxed|circles\b|dotted|dashed|"
    r"all\b|in\s+all|for\s+all|each\b|these\b|both\b|throughout|abbreviations|error\s+bars|"
    r"data\s+(?:are|is|were|represent|in\b)|values\s+(?:are|represent)|results\s+(?:are|represent)|"
    r"immunohistochemistry\s+with|hematoxylin|haematoxylin|h\s*&\s*e\b|h\s*and\s*e\b|"
    r"arrow\s+(?:indicates|shows|points)|scale\s*=|scale\s*bars?\s+(?:in|for)\s+all)",
    re.IGNORECASE,
)
_SHARED_ANY_RE = re.compile(
    r"\b(?:all|each|every)\s+(?:the\s+)?(?:panels?|images?|cores?|sections?|pictures?|micrographs?|"
    r"photomicrographs?|figures?|graphs?|samples?|cases?)\b|\bsame\s+magnification\b",
    re.IGNORECASE,
)
_SINGLE_REF_BEFORE_RE = re.compile(r"\b(?:in|of|from|on|panels?|see|and|between|to)\s{1,3}$", re.IGNORECASE)
# "Arrows in K point to ...", "Data in b are ...": a lone label between "in" and a verb is a
# reference (a verb cannot follow the article "a", so "in a point to" names panel a).
_REF_VERB_AFTER_RE = re.compile(
    r"\s{1,2}(?:are|is|were|was|show|shows|indicate|indicates|mark|marks|point|points|denote|denotes|"
    r"outline|outlines|highlight|highlights|represent|represents|depict|depicts)\b"
)


_HYPHEN_GLUE_RE = re.compile(_DASH + r"[A-Za-z0-9]")
_HYPHEN_GLUED_RE = re.compile(r"[A-Za-z0-9]" + _DASH + r"$")


@dataclass
class _Segment:
    start: int
    end: int
    recipients: frozenset[str] | None  # None: every label (shared)
    raw_end: int = -1  # end before a dangling connector was cut ("... nanoparticles and")


def _named_labels(
    text: str, lo: int, hi: int, known: dict[Key, str], roman: bool, upper: bool | None
) -> set[str]:
    """Known labels that the text in [lo, hi) names as references: "(c, d)", "in a,d", "a and b"."""
    names: set[str] = set()
    if hi <= lo:
        return names
    chunk = text[lo : min(hi, lo + _MAX_SENTENCE_CHARS)]

    def add(expr: str) -> None:
        for t, k in _expand(expr, roman):
            if upper is not None and k[0] in (0, 1) and t[:1].isupper() != upper:
                continue
            if k in known:
                names.add(known[k])
            else:  # "Scale bar, 50 µm (c)" with panels c1 to c3: the group's
                names.update(known[m] for m in _members_of(k, known))

    spans: list[tuple[int, int]] = []
    for m in _PAREN_RE.finditer(chunk):
        add(m.group("expr"))
        spans.append(m.span() if not m.group("annot") else m.span("expr"))
    si = 0
    for m in _EXPR_RE.finditer(chunk):
        while si < len(spans) and spans[si][1] <= m.start():
            si += 1
        if si < len(spans) and spans[si][0] <= m.start():
            continue
        expr = m.group(0)
        if _HYPHEN_GLUE_RE.match(chunk, m.end()) or _HYPHEN_GLUED_RE.search(
            chunk, max(0, m.start() - 2), m.start()
        ):
            continue  # "C-C3-positive cells", "anti-B-C": part of a hyphenated word
        if len(_TOKEN_RE.findall(expr)) >= 2:
            add(expr)
        elif _SINGLE_REF_BEFORE_RE.search(chunk[max(0, m.start() - 12) : m.start()]):
            after = chunk[m.end() : m.end() + 14]
            if _REF_AFTER_RE.match(after) or _REF_VERB_AFTER_RE.match(after):
                add(expr)
    return names


def _strip_piece(text: str, a: int, b: int) -> tuple[int, int]:
    while a < b and text[a].isspace():
        a += 1
    while b > a and text[b - 1].isspace():
        b -= 1
    return a, b


_DANGLING_RE = re.compile(
    r"(?:[,;]?\s{1,3}(?:and|or|while|whereas|but|vs\.?|versus)|\s{0,3}[,;])\s*$", re.IGNORECASE
)


def _distribute(
    text: str,
    splits: list[_Split],
    all_labels: list[str],
    known: dict[Key, str],
    roman: bool,
    upper: bool | None,
    cands: list[_Candidate],
    divide_members: bool = False,
) -> tuple[str, list[_Segment]]:
    """Preamble and the segments of text with the labels they go to."""
    n = len(text)
    post = any(s.post for s in splits)
    protected = [(s.start, s.end) for s in splits]
    natural_set = set(_sentence_starts(text, 0, n, protected))
    natural_set.update(s.start for s in splits if not s.post and _boundary_kind(text, s.start) == "sentence")
    natural = [0, *sorted(x for x in natural_set if 0 < x < n)]

    def sentence_start(pos: int) -> int:
        return natural[bisect.bisect_right(natural, pos) - 1]

    label_sets = [frozenset(s.labels) for s in splits]
    segments: list[_Segment] = []
    # Fragment spans [a, b) and where each fragment's first sentence ends.
    starts: list[int] = []
    heads: list[int] = []
    if post:
        # "... LDLR (a); a consecutive ... SR-BI (b). More about b. Tissue ... (c)."
        for i, s in enumerate(splits):
            if not s.post:
                starts.append(s.start)
                nxt = bisect.bisect_right(natural, s.start)
                heads.append(natural[nxt] if nxt < len(natural) else n)
                continue
            begin = sentence_start(s.start)
            if i and begin <= splits[i - 1].start:
                begin = _skip_separators(text, splits[i - 1].end)
                if not splits[i - 1].post:
                    # "(iii) Cells were stained (arrows) and S6 was detected (iv).": the last clause.
                    begin = _clause_start(text, begin, s.start)
            starts.append(begin)
            heads.append(_skip_separators(text, s.end))
        for i in range(1, len(starts)):
            starts[i] = max(starts[i], starts[i - 1])
        # "... with H&E (E), AR (F) and Ki-67 (G) staining.": a short tail of the sentence is theirs.
        i = 0
        while i < len(splits):
            j = i
            sentence = sentence_start(splits[i].end)
            while (
                j + 1 < len(splits) and splits[j + 1].post and sentence_start(splits[j + 1].start) == sentence
            ):
                j += 1
            if splits[j].post:
                nxt = bisect.bisect_right(natural, splits[j].end)
                sentence_end = natural[nxt] if nxt < len(natural) else n
                tail = _skip_separators(text, splits[j].end)
                short = len(text[tail:sentence_end].split()) <= 4
                if tail < sentence_end and short and (j + 1 >= len(starts) or starts[j + 1] >= sentence_end):
                    heads[j] = sentence_end
                    others = frozenset().union(*(label_sets[k] for k in range(i, j) if splits[k].post))
                    if others:
                        segments.append(_Segment(tail, sentence_end, others))
            i = j + 1
        heads = [min(h, e) for h, e in zip(heads, [*starts[1:], n], strict=False)]
        preamble_end = starts[0]
    else:
        starts = [s.start for s in splits]
        preamble_end = starts[0]
    ends = [*starts[1:], n]
    if not post:
        for i in range(len(splits)):
            nxt = bisect.bisect_right(natural, starts[i])
            heads.append(min(natural[nxt] if nxt < len(natural) else n, ends[i]))
        # Mid-sentence starts: "Distribution of sizes of (c) ... and (f) ..." share the sentence head.
        by_sentence: dict[int, list[int]] = {}
        for i, s in enumerate(splits):
            by_sentence.setdefault(sentence_start(s.start), []).append(i)
        for head_start, members in by_sentence.items():
            first = members[0]
            head = text[head_start : splits[first].start].strip()
            if first == 0 or not head or not (head.endswith(":") or _ENDS_OPEN_RE.search(head[-24:])):
                continue  # "... 20 microns (c) Hematoxylin ...": the words before belong to (b)
            ends[first - 1] = min(ends[first - 1], head_start)
            heads[first - 1] = min(heads[first - 1], ends[first - 1])
            recipients = frozenset().union(*(label_sets[i] for i in members))
            segments.append(_Segment(head_start, splits[first].start, recipients))
        # Fragments cut mid-sentence lose their dangling "and" / "," before the next label.
        raw_ends = list(ends)
        for i in range(len(splits) - 1):
            if _boundary_kind(text, splits[i + 1].start) != "sentence" and ends[i] == splits[i + 1].start:
                m = _DANGLING_RE.search(text, max(starts[i], ends[i] - 24), ends[i])
                if m and m.start() > splits[i].end:
                    ends[i] = m.start()
                    heads[i] = min(heads[i], ends[i])

    described = set().union(*label_sets)
    missing = {lab for lab in all_labels if lab not in described}
    holes: list[list[tuple[int, int]]] = [[] for _ in splits]
    # Later sentences of each fragment: cross-panel sentences and the trailing shared part.
    frag_sentences: list[list[tuple[int, int]]] = []
    for i in range(len(splits)):
        b, h = ends[i], heads[i]
        cuts = [h] + [x for x in natural[bisect.bisect_right(natural, h) :] if x < b]
        frag_sentences.append(
            [(lo, hi) for lo, hi in zip(cuts, [*cuts[1:], b], strict=False) if text[lo:hi].strip()]
        )
    last = len(splits) - 1
    # Sentence kinds the other panels repeat ("Original magnification ...") stay with the last one.
    repeated = {
        _sentence_kind(text[lo : min(hi, lo + 60)])
        for i in range(last)
        for lo, hi in frag_sentences[i]
        if _sentence_kind(text[lo : min(hi, lo + 60)])
    }

    def shared_kind(lo: int, hi: int) -> bool:
        return _sentence_kind(text[lo : min(hi, lo + 60)]) not in repeated

    single = last > 0 and all(not frag_sentences[i] for i in range(last))
    # The caption notes markers panel by panel ("(a) ... Arrows mark X. (b) ..."), so an unnamed
    # marker note after the last panel's description belongs to that panel.
    marker_style = any(
        _MARKER_NOTE_RE.match(text[lo : min(hi, lo + 80)].strip())
        for i in range(last)
        for lo, hi in frag_sentences[i]
    )
    trailing_from: int | None = None
    # Other panels note their own scale bars: an unnamed one after the last panel is its own.
    scale_elsewhere = any(_SCALE_MENTION_RE.search(text, starts[i], ends[i]) for i in range(last))
    if single and not frag_sentences[last] and not post:
        # "A) lung, B) breast, ..., F) colon cancer; 10* magnification.": a closing clause for all.
        clause = _SHARED_CLAUSE_RE.search(text, starts[last], heads[last])
        before = text[starts[last] : clause.start()] if clause else ""
        own_layout = clause is not None and (
            _PANEL_PART_RE.match(clause.group(1))
            or _own_scale_note(clause.group(1), scale_elsewhere and len(label_sets[last]) >= 2)
        )
        if (
            clause
            and not own_layout
            and text[clause.start(1) : heads[last]].strip()
            and before.count("(") <= before.count(")")
        ):
            segments.append(_Segment(clause.start(1), heads[last], None))
            ends[last] = clause.start() + 1
    own_last = label_sets[last]
    first = True
    open_notes: set[int] = set()  # unnamed marker notes of the last fragment shared one by one
    for k, (lo, hi) in enumerate(frag_sentences[last]):
        note = text[lo : min(hi, lo + 500)].strip()
        names = _named_labels(text, lo, hi, known, roman, upper)
        if len(own_last) >= 2 and names and names <= own_last:
            # "(K, L) ... Arrows in K ...", "(A-D) ... Scale bars, 1 cm (A) and 5 µm (D).": the
            # group's own text, for K and L, for A to D
            continue
        if names and names - own_last and not names <= missing and _note_about_panels(note):
            # "(B) ... Arrow in A points to ...", "Scale bars, 1 nm (a) and 0.2 nm (c, d)": about
            # other panels too, so no longer the last panel's own text.
            trailing_from = k
            break
        if not names and k == 0 and _own_scale_note(note, scale_elsewhere and len(own_last) >= 2):
            first = False
            continue  # "(c) ... Scale bar, 5 nm.": one bar, or every panel notes its own
        closing_bars = not scale_elsewhere and (len(own_last) == 1 or k > 0)
        if not names and _SCALE_VALUE_RE.match(note) and closing_bars:
            # "(d) ... Scale bars, 50 um.": bars of several panels, not only (d)'s; after the last
            # group's own notes ("... Arrows in E mark X. Scale bars, 1 mm.") a closing note. Where
            # the other panels note their own bars, the last one's is its own too.
            trailing_from = k
            break
        if not names and _MARKER_NOTE_RE.match(note):
            first = False
            if not marker_style:
                # "(D) ... Arrows indicate nucleoli.": which panels show them the caption leaves
                # open (a legend for all, or the last panel's note): shared, for the image to
                # settle; the group's notes after it stay the group's.
                open_notes.add(k)
            continue  # per-panel marker notes: this one is the last panel's own
        if open_notes and not names:
            trailing_from = k  # "Arrows, osteoblasts. Scale = 50 um.": a legend, then more of it
            break
        if single and first and not _is_own_sentence(note[:200]):
            trailing_from = k  # every other panel's text is one sentence: the rest is for all
            break
        first = False
        if _is_shared_sentence(note) and shared_kind(lo, hi):
            trailing_from = k
            break
    for i in range(len(splits)):
        own = label_sets[i]
        run_start: int | None = None
        for k, (lo, hi) in enumerate(frag_sentences[i]):
            names = _named_labels(text, lo, hi, known, roman, upper)
            if i == last and trailing_from is not None and k >= trailing_from:
                if k == trailing_from:
                    ends[i] = lo
                segments.append(_Segment(lo, hi, frozenset(names) if names else None))
                continue
            if i == last and k in open_notes:
                holes[i].append((lo, hi))
                segments.append(_Segment(lo, hi, None))
                run_start = None
                continue
            if not names:
                if run_start is None:
                    run_start = lo
                continue
            lead = _leading_names(text, lo, hi, known, roman)
            if names <= missing or (lead and not lead & own):
                # "... (anti-CD34, E-H) ...": about panels without text of their own;
                # "(A) Scale bar: 100 µm." inside another panel's text: about panel A.
                holes[i].append((lo, hi))
                segments.append(_Segment(lo, hi, frozenset(lead or names)))
            elif len(names) >= 2 and names - own:
                segments.append(
                    _Segment(run_start if run_start is not None else lo, hi, frozenset(names - own))
                )
            run_start = None
    if not post and divide_members:
        later: set[str] = set()
        for i in range(len(splits) - 1, -1, -1):
            if len(label_sets[i]) >= 2 and not label_sets[i] & later:
                clauses = _member_clauses(text, splits[i], starts[i], ends[i], cands, known, roman, natural)
                for lo, hi, member in clauses:
                    segments.append(_Segment(lo, hi, member))
                if clauses:
                    holes[i].append((clauses[0][0], clauses[-1][1]))
            later |= label_sets[i]
    for i in range(len(splits)):
        raw_end = raw_ends[i] if not post and i != last else ends[i]
        lo = starts[i]
        for h_lo, h_hi in sorted(holes[i]):
            if h_hi <= ends[i]:
                segments.append(_Segment(lo, h_lo, label_sets[i]))
                lo = h_hi
        segments.append(_Segment(lo, ends[i], label_sets[i], raw_end=max(raw_end, ends[i])))

    # Labels without a fragment of their own get the sentences that name them.
    if missing:
        bounds = [*natural, n]
        for lo, hi in itertools.pairwise(bounds):
            if hi <= preamble_end:
                continue
            lo = max(lo, preamble_end)
            names = _named_labels(text, lo, hi, known, roman, upper) & missing
            if names:
                segments.append(_Segment(lo, hi, frozenset(names)))
    return text[:preamble_end], segments


def _leading_names(text: str, lo: int, hi: int, known: dict[Key, str], roman: bool) -> frozenset[str]:
    """Known labels of a marker that starts the sentence [lo, hi): "(A) Scale bar: ..."."""
    m = _LEAD_MARKER_RE.match(text[lo : min(hi, lo + 200)])
    if not m or not m.group("p"):
        return frozenset()
    names: set[str] = set()
    for group in _PAREN_RE.finditer(m.group(0)):  # "(B), (C), and (D)": every group
        names.update(known[k] for _, k in _expand(group.group("expr"), roman) if k in known)
    return frozenset(names)


def _member_clauses(
    text: str,
    split: _Split,
    start: int,
    end: int,
    cands: list[_Candidate],
    known: dict[Key, str],
    roman: bool,
    natural: list[int],
) -> list[tuple[int, int, frozenset[str]]]:
    """Clauses of a group fragment that end with its members' labels, up to the sentence end.

    "(A-D) ... staining pattern: epithelial area (A), nuclei (B), stroma (C), or vessels (D)."
    gives "epithelial area (A)" to A, "nuclei (B)" to B, ...; the rest stays with the group.
    Members that continue the sentence ("... of the BM (c), PM (d), and SMNp (e) showing ...")
    are references and stay in the group text.
    """
    group = [known.get(k, lab) for lab, k in zip(split.labels, split.keys, strict=False)]
    order = {lab: i for i, lab in enumerate(group)}
    inline: list[tuple[int, int, frozenset[str]]] = []
    for c in cands[_first_at(cands, split.end) :]:
        if c.start >= end:
            break
        if c.form != "paren" or c.blocked or c.boundary == "sentence":
            continue
        if re.match(r"[(\[]\s{0,3}[A-Za-z]{3}", text[c.start : c.end]):
            continue  # "(panel D)", "(image A)": a reference
        names = frozenset(known[k] for _, k in _expand(c.expr, roman) if k in known)
        if not names or not names <= set(group):
            continue
        inline.append((c.start, c.end, names))
    clauses: list[tuple[int, int, frozenset[str]]] = []
    i = 0
    while i < len(inline):
        sentence = natural[bisect.bisect_right(natural, inline[i][0]) - 1]
        run = [inline[i]]
        i += 1
        while i < len(inline) and natural[bisect.bisect_right(natural, inline[i][0]) - 1] == sentence:
            run.append(inline[i])
            i += 1
        covered: set[str] = set()
        ordered = True
        for _, _, names in run:
            if covered & names or (covered and min(order[x] for x in names) < max(order[x] for x in covered)):
                ordered = False
            covered |= names
        after = _skip_spaces(text, run[-1][1])
        if len(run) < 2 or not ordered or covered != set(group) or not (after >= end or text[after] in ".;"):
            continue
        head = max(sentence, start)
        colon = text.rfind(":", head, run[0][0])
        lo = colon + 1 if colon >= 0 else head
        for k, (_, b, names) in enumerate(run):
            lo = _skip_spaces(text, lo)
            if k == len(run) - 1 and after < end:
                b = after + 1  # the full stop that ends the list
            clauses.append((lo, b, names))
            lo = _skip_separators(text, b)
        break
    return clauses


def _clause_start(text: str, lo: int, hi: int) -> int:
    """Start of the last top-level clause in [lo, hi): after ", " / "; ", or at "and"."""
    depth = 0
    for i in range(hi - 1, max(lo, hi - 2000) - 1, -1):
        ch = text[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth = max(0, depth - 1)
        elif depth == 0:
            if ch in ",;" and i + 1 < hi and text[i + 1].isspace():
                return _skip_spaces(text, i + 1)
            if text.startswith(" and ", i) and i + 1 < hi:
                return i + 1
    return lo


def _first_at(cands: list[_Candidate], pos: int) -> int:
    """Index of the first candidate starting at or after ``pos`` (candidates are sorted)."""
    lo, hi = 0, len(cands)
    while lo < hi:
        mid = (lo + hi) // 2
        if cands[mid].start < pos:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _skip_spaces(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos].isspace():
        pos += 1
    return pos


def _skip_separators(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and (text[pos].isspace() or text[pos] in ".,;:"):
        pos += 1
    return pos


# "Scale bars, 1 cm (A) and 5 µm (D).": always a note for the panels it names (or all).
# A bare scale-bar value: "Scale bar, 5 nm.", "scale bars: 20 um" (not "Scale bar was shown ...").
_SCALE_VALUE_RE = re.compile(r"^;?\s*scale\s*(?P<bars>bars?)\s*[,:=]?\s*\d", re.IGNORECASE)
_SCALE_MENTION_RE = re.compile(r"\bscale\s*bars?\b", re.IGNORECASE)
# A sentence about glyphs drawn on the image: "Red arrows indicate ...", "Dashed boxes outline ...".
_MARKER_NOTE_RE = re.compile(
    r"^(?:the\s+)?(?:(?:white|black|red|green|blue|yellow|cyan|magenta|orange|open|filled|solid|dashed|dotted)"
    r"\s+)?(?:arrows?|arrowheads?|asterisks?|stars?|boxes|box|boxed\s+areas?|circles?|insets?)\b",
    re.IGNORECASE,
)
_FOOTNOTE_RE = re.compile(r"^(?:[*#\u2020\u2021]|\(\*+\)|scale\s*[,:=])", re.IGNORECASE)


_SHARED_CLAUSE_RE = re.compile(
    r";\s{1,3}([^;]{0,40}\b(?:magnifications?|scale\s*bars?|bars?|stain(?:ing|ed)?|counterstain\w*)\b"
    r"[^;]{0,40})\s*$",
    re.IGNORECASE,
)


# "; left to right, increasing magnification", "; right, higher magnification of ...": how the
# last panel's own parts are laid out, not a note for every panel
_PANEL_PART_RE = re.compile(
    r"(?:left|right|upper|lower|top|bottom|middle|centre|center|insets?)\b", re.IGNORECASE
)


def _sentence_kind(sentence: str) -> str:
    """First two words, lower-cased: sentences of the same kind ("original magnification")."""
    words = re.findall(r"[A-Za-z]+", sentence[:60])
    return " ".join(words[:2]).lower() if len(words) >= 2 else ""


def _own_scale_note(note: str, others_note: bool) -> bool:
    """An unnamed scale-bar value after the last panel's text that is that panel's own: one bar
    ("Scale bar, 5 nm."), or bars of a last group whose other panels note their own
    (``others_note``: "(A) ...; scale bar, 1 cm. (B, C) ... Scale bars, 20 nm.")."""
    m = _SCALE_VALUE_RE.match(note)
    return bool(m and (others_note or m.group("bars").lower() == "bar"))


# "Results in A-C are ...", "Arrows in (K) point ...": panels named as the subject of a statement
_PANELS_THEN_VERB_RE = re.compile(
    r"\b(?:in|of)\s{1,3}\(?[A-Za-z](?:\s{0,2}(?:[-\u2013,]|and)\s{0,2}[A-Za-z])*\)?"
    + _REF_VERB_AFTER_RE.pattern
)


def _note_about_panels(sentence: str) -> bool:
    """A note that points into other panels' images or states what holds for them (markers,
    scale bars, data, "all"), not a description that refers back to an earlier panel's
    experiment ("Mice in (A) after feeding were fasted ...")."""
    return bool(
        _MARKER_NOTE_RE.match(sentence)
        or _PANELS_THEN_VERB_RE.search(sentence)
        or _SCALE_MENTION_RE.search(sentence)
        or _SHARED_START_RE.match(sentence)
        or _SHARED_ANY_RE.search(sentence)
    )


def _is_own_sentence(sentence: str) -> bool:
    """A footnote ("*P < 0.05.", "Scale, 100 µm.") after the last panel's text is that panel's own."""
    return bool(_FOOTNOTE_RE.match(sentence))


def _is_shared_sentence(sentence: str) -> bool:
    if _is_own_sentence(sentence):
        return False
    return bool(_SHARED_START_RE.match(sentence) or _SHARED_ANY_RE.search(sentence))


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def _empty_split(caption: str, labels: list[str] | None) -> CaptionSplit:
    text = caption.strip()
    subs = {lab: text for lab in labels or []}
    return CaptionSplit(
        preamble=text,
        subcaptions=subs,
        own_fragments={lab: [] for lab in subs},
        shared_trailing=[],
        marker_fragments={lab: _marker_fragments([text]) for lab in subs}
        if text
        else {lab: [] for lab in subs},
        labels_in_order=list(subs),
    )


def _marker_fragments(
    pieces: list[str], cache: dict[str, list[CaptionFragment]] | None = None
) -> list[CaptionFragment]:
    """Sentences of the pieces that mention a marker word, with the words found."""
    out: list[CaptionFragment] = []
    for piece in pieces:
        found = cache.get(piece) if cache is not None else None
        if found is None:
            found = []
            if _MARKER_RE.search(piece.lower()):
                for sentence in _split_sentences(piece):
                    mentions = find_marker_mentions(sentence)
                    if mentions:
                        found.append(CaptionFragment(text=sentence, mentions=mentions))
            if cache is not None:
                cache[piece] = found
        out.extend(found)
    return out


def _complete_hint(text: str, labels: list[str]) -> list[str]:
    """The hint plus the labels the caption itself names, when the two agree on most labels.

    OCR may miss a panel's label (or segmentation a panel): a hint without it would read that
    panel's text as part of its neighbour's fragment (a bare "c Overview..." that is no known
    label is text; labels after the last hinted one are text). When the caption's own reading
    names the hint's labels (all of one or two, all but one of more), the labels only the caption
    names are added, so their text gets cut off and goes to them."""
    hint = _make_hint(labels)
    if hint is None or not hint.keys:
        return labels
    own = _split_unhinted(text)
    roman = bool(hint.roman)
    own_keys: dict[Key, str] = {}
    for lab in own:
        key = _parse_token(normalize_label(lab), roman)
        if key is not None and key[0] != 3:
            own_keys.setdefault(key, lab)
    agree = sum(key in own_keys for key in hint.keys)
    # A group label whose members the hint has ("c" of c1-c6) names them, it is no panel; a
    # sub-panel of a hinted panel that has none ("a2" of a) is part of it.
    extra = [
        lab
        for key, lab in own_keys.items()
        if key not in hint.keys and not _members_of(key, hint.keys) and _parent_of(key, hint.keys) is None
    ]
    if not extra or agree < (len(hint.keys) if len(hint.keys) <= 2 else len(hint.keys) - 1):
        return labels
    return [*labels, *extra]


@functools.lru_cache(maxsize=256)
def _split_unhinted(text: str) -> tuple[str, ...]:
    return tuple(split_caption(text).labels_in_order)


def split_caption(
    caption: str,
    labels: list[str] | None = None,
    *,
    divide_members: bool = False,
    labels_complete: bool = False,
) -> CaptionSplit:
    """Split a figure caption into per-panel subcaptions (verbatim convention, see module doc).

    ``divide_members``: a group fragment whose sentence ends in a list of its members ("(C, D)
    Tumour volume (C) and viability (D).") gives each member only its clause. The prostate set
    divides such fragments; the verbatim convention of the real figures gives the whole fragment
    to every member, so the miner leaves it whole (the default).

    ``labels``: the panel labels found in the image, when known. They settle ambiguous tokens
    (a bare "a" that is no known label is text; "i" is a roman numeral when the labels are) and
    every one of them gets a subcaption. They may be a subset or superset of what the caption
    names and may differ in case. By default they are read as what OCR found in the image, which
    may miss panels: when they agree with the caption's own labels, the labels only the caption
    names are added. ``labels_complete``: the labels are every panel of the figure (annotations),
    so a caption label outside them is text (a caption may go on about panels not shown).
    """
    text = caption if isinstance(caption, str) else ""
    if labels is not None and not labels_complete and text.strip():
        labels = _complete_hint(text, labels)
    hint = _make_hint(labels)
    hint_labels = [lab for lab in (labels or []) if lab and normalize_label(lab)]
    if not text.strip():
        return _empty_split("", hint_labels if labels is not None else None)

    cands = _find_candidates(text)
    roman = _decide_roman(cands, hint)
    pre = _select(text, cands, hint, roman, post_mode=False)
    post = _select(text, cands, hint, roman, post_mode=True)
    pre_count = len({k for s in pre for k in s.keys})
    post_count = len({k for s in post for k in s.keys})
    # Ties go to the reading whose first label comes first ("Kidney (A-C) and prostate (D-F). A: ...").
    earlier = bool(post) and bool(pre) and post[0].start < pre[0].start
    splits = post if post_count > pre_count or (post_count == pre_count and earlier) else pre
    if not splits or (hint is not None and hint.positions and not hint.keys):
        pos_cands = _find_position_candidates(text)
        pos_pre = _select_positions(pos_cands, post_mode=False)
        pos_post = _select_positions(pos_cands, post_mode=True)
        pos_splits = pos_post if len(pos_post) > len(pos_pre) else pos_pre
        if len(pos_splits) >= 2 or (pos_splits and hint is not None and hint.positions):
            splits = pos_splits
    if not splits:
        return _empty_split(text, hint_labels if labels is not None else None)

    # Output spelling: the hint's when it names the label, else the caption's.
    known: dict[Key, str] = {}
    order: list[str] = []
    upper: bool | None = None
    for s in splits:
        out_labels = []
        for lab, key in zip(s.labels, s.keys, strict=False):
            if key[0] == 3:
                name = hint.positions.get(lab, lab) if hint is not None else lab
            else:
                name = hint.keys.get(key, lab) if hint is not None else lab
                if upper is None and key[0] in (0, 1):
                    upper = lab[:1].isupper()
            known.setdefault(key, name)
            out_labels.append(known[key])
            if known[key] not in order:
                order.append(known[key])
        s.labels = out_labels
    if hint is not None:
        for key, name in sorted(hint.keys.items()):
            known.setdefault(key, name)
        for name in hint.positions.values():
            known.setdefault((3, 1000 + len(known), 0), name)
    else:
        # Inline references that fill gaps of the sequence ("(a) ... compared with (b) ... (c)").
        found = sorted(k for k in known if k[0] != 3)
        if found and found[0][0] in (0, 1):
            like = splits[0].labels[0]
            for major in range(found[0][1], found[-1][1]):
                key = (found[0][0], major, 0)
                if key not in known and not any(k[1] == major for k in found):
                    name = _label_text(key, like)
                    if re.search(r"[(\[]\s{0,3}" + re.escape(name) + r"\s{0,3}[)\]]", text):
                        known[key] = name
    all_labels = list(order)
    for key in sorted(known):
        if known[key] not in all_labels:
            all_labels.append(known[key])

    preamble, segments = _distribute(text, splits, all_labels, known, roman, upper, cands, divide_members)
    segments.sort(key=lambda s: (s.start, s.end))
    # label -> (position, verbatim piece, raw piece, shared?)
    pieces: dict[str, list[tuple[int, str, str, bool]]] = {lab: [] for lab in all_labels}
    shared: list[str] = []
    for seg in segments:
        a, b = _strip_piece(text, seg.start, seg.end)
        if a >= b:
            continue
        piece = text[a:b]
        raw = text[a : _strip_piece(text, a, max(seg.raw_end, b))[1]]
        if seg.recipients is None:
            shared.append(piece)
            for lab in all_labels:
                pieces[lab].append((a, piece, raw, True))
        else:
            for lab in seg.recipients:
                if lab in pieces:
                    pieces[lab].append((a, piece, raw, False))
    subcaptions: dict[str, str] = {}
    own: dict[str, list[str]] = {}
    markers: dict[str, list[CaptionFragment]] = {}
    marker_cache: dict[str, list[CaptionFragment]] = {}
    for lab in all_labels:
        items = sorted(set(pieces[lab]))
        texts = [p for _, p, _, _ in items]
        subcaptions[lab] = " ".join(texts)
        own[lab] = [raw for _, _, raw, is_shared in items if not is_shared]
        markers[lab] = _marker_fragments(texts, marker_cache)
    return CaptionSplit(
        preamble=preamble.strip(),
        subcaptions=subcaptions,
        own_fragments=own,
        shared_trailing=shared,
        marker_fragments=markers,
        labels_in_order=all_labels,
    )


# --------------------------------------------------------------------------------------------
# The other convention
# --------------------------------------------------------------------------------------------

_LEAD_MARKER_RE = re.compile(
    r"^\s{0,3}(?:[(\[]\s{0,3}(?P<p>" + _PEXPR + r")\s{0,3}(?:[,;:]\s{0,3}[^()\[\]]{1,60}?)?[)\]]"
    r"(?:" + _SEP + r"(?:\(\s{0,3}" + _EXPR + r"\s{0,3}\)|" + _EXPR + r"\)))*"
    r"\s{0,3}[.:,]?|(?P<b>" + _EXPR + r")(?P<t>\.(?=\s)|\)|:|,(?=\s)|(?=\s)))\s*"
)
_TAIL_MARKER_RE = re.compile(
    r"\s{0,3}[(\[]\s{0,3}(?:(?:images?|panels?)\s{1,3})?(?P<p>"
    + _PEXPR
    + r")\s{0,3}(?:[,;:][^()\[\]]{1,60}?)?[)\]]"
    r"\s{0,3}[.,;:]?$"
)
_LEAD_POSITION_RE = re.compile(
    r"(?i)^\s{0,3}(?:\(\s{0,3}"
    + _POSITION
    + _POSITION_TAIL
    + r"\s{0,3}\)|"
    + _POSITION
    + _POSITION_TAIL
    + r"\s{0,3}[:,.)])\s*"
)


def _names_labels(expr: str, labels: set[str] | frozenset[str]) -> bool:
    return _names_labels_cached(expr, frozenset(lab.lower() for lab in labels))


@functools.lru_cache(maxsize=4096)
def _names_labels_cached(expr: str, low: frozenset[str]) -> bool:
    named = expand_label_expression(expr)
    return bool(named) and all(n.lower() in low for n in named)


def _strip_markers(piece: str, labels: set[str]) -> tuple[str, bool]:
    """The piece without its own label marker (leading "(A)", "A.", "b, c" or trailing "(a)."),
    and whether it had one."""
    found = False
    m = _LEAD_MARKER_RE.match(piece)
    if m:
        expr = m.group("p") or m.group("b") or ""
        rest = piece[m.end() :]
        lower_next = rest[:1].islower()
        if _names_labels(expr, labels) and not (m.group("b") and m.group("t") == "" and lower_next):
            piece = rest
            found = True
    else:
        p = _LEAD_POSITION_RE.match(piece)
        if p and _canonical_position(p.group(0)) in {_canonical_position(x) for x in labels}:
            piece = piece[p.end() :]
            found = True
    window = max(0, len(piece) - 300)
    t = _TAIL_MARKER_RE.search(piece, window)
    if t and _names_labels(t.group("p"), labels):
        # Only a post-positioned label of its own ("... stained for LDLR (a)."), not the end of a
        # sentence that names several panels ("... between (a) and (b).").
        others = any(
            _names_labels(g.group("expr"), labels)
            for g in _PAREN_RE.finditer(piece, max(0, t.start() - 300), t.start())
        )
        if not others:
            end_mark = piece[t.start() :].rstrip()[-1:]
            piece = piece[: t.start()]
            if end_mark in ".!?" and _ENDS_OPEN_RE.search(piece.rstrip()[-24:]):
                piece = piece.rstrip() + end_mark  # "... are shown in (d)." keeps its full stop
            found = True
    return piece.strip(), found


_LIST_ITEM_MARKER_RE = re.compile(
    r"\s{0,3}(?:[(\[]\s{0,3}(?P<p>"
    + _PEXPR
    + r")\s{0,3}[)\]](?:\s{0,3}(?:,|and|or)\s{0,3}[(\[]\s{0,3}"
    + _PEXPR
    + r"\s{0,3}[)\]]){0,10}|(?P<b>"
    + _EXPR
    + r")(?=\s{0,3}:))\s{0,3}[,:]?\s{0,3}"
)


def _list_item(piece: str, label: str, labels: set[str]) -> str | None:
    """The label's item of a per-panel list: "Scale bars: (i), 100 µm; (ii-vi), 25 µm." gives
    "Scale bars: 100 µm;" to i. None when the piece is not such a list."""
    if len(piece) > 1000 or not 1 <= piece.count(";") <= 20:
        return None
    items = piece.split(";")
    low = label.lower()
    found: str | None = None
    prefix = ""
    for k, item in enumerate(items):
        start = 0
        if k == 0:
            first = _LIST_ITEM_MARKER_RE.search(item)
            if not first:
                return None
            start = first.start()
            prefix = item[:start].strip()
        m = _LIST_ITEM_MARKER_RE.match(item, start)
        if not m:
            return None
        names = [n.lower() for g in _ONE_MARKER_RE.findall(m.group(0)) for n in expand_label_expression(g)]
        if not names or not all(n in {x.lower() for x in labels} for n in names):
            return None
        if low in names:
            value = item[m.end() :].strip()
            found = value + (";" if k < len(items) - 1 else "")
    if found is None:
        return None
    prefix = prefix if prefix.strip("([ ") else ""
    return (prefix + " " + found).strip()


_ONE_MARKER_RE = re.compile(r"[(\[][^()\[\]]{1,40}[)\]]|" + _EXPR)


def _strip_preamble_reference(preamble: str, labels: set[str]) -> str:
    """ "... in PCa sections A-B." -> "... in PCa sections.": a closing reference to the panels."""
    tail = max(0, len(preamble) - 120)
    m = _PREAMBLE_REF_RE.search(preamble, tail)
    if m and len(expand_label_expression(m.group("expr"))) >= 2 and _names_labels(m.group("expr"), labels):
        return preamble[: m.start()] + preamble[m.end("expr") :]
    return preamble


_PREAMBLE_REF_RE = re.compile(r"\s{1,3}(?P<expr>" + _EXPR + r")\s{0,3}[.:;]?\s*$")


def to_prostate_convention(split: CaptionSplit) -> dict[str, str]:
    """label -> preamble + the label's own text + shared text, label markers removed.

    This is the convention of ``data/caption-splitting/prostate.jsonl``: the shared preamble is
    prepended to every panel's fragment and the fragment's own label marker ("(A)", "A.",
    "b, c", a trailing "(a).") is dropped, so is a closing panel reference of the preamble
    ("... sections A-B."). Pieces are joined with one space; the preamble or a fragment that no
    longer ends with punctuation gets a full stop when a capitalised piece follows it.
    """
    labels = set(split.subcaptions)
    preamble = _strip_preamble_reference(split.preamble, labels)
    out: dict[str, str] = {}
    stripped: dict[str, tuple[str, bool]] = {}

    def strip(piece: str) -> tuple[str, bool]:
        if piece not in stripped:
            stripped[piece] = _strip_markers(piece, labels)
        return stripped[piece]

    for label, verbatim in split.subcaptions.items():
        own = split.own_fragments.get(label, [])
        if not own and not split.shared_trailing:
            out[label] = split.preamble or verbatim
            continue
        ordered = _merge_in_order(verbatim, own, split.shared_trailing)
        parts: list[tuple[str, bool]] = [(preamble, True)] if preamble else []
        first, first_is_own = ordered[0] if ordered else ("", False)
        if first_is_own and not strip(first)[1] and not _ENDS_CLAUSE_RE.search(first[-4:]):
            # A sentence head of its own ("Bladder sections are derived from F) ..., G) ...")
            # stands in for the caption's preamble.
            parts = []
        for p, is_own in ordered:
            if not is_own:
                parts.append((p, False))
                continue
            item = _list_item(p, label, labels)
            parts.append((item, False) if item is not None else strip(p))
        parts = [(p, closes) for p, closes in parts if p]
        joined: list[str] = []
        for i, (part, closes) in enumerate(parts):
            follows = parts[i + 1][0] if i + 1 < len(parts) else ""
            if (
                closes
                and follows
                and not follows[:1].islower()
                and not _ENDS_CLAUSE_RE.search(part[-4:])
                and not _ENDS_OPEN_RE.search(part[-24:])
            ):
                part += "."
            joined.append(part)
        out[label] = " ".join(joined)
    return out


def _merge_in_order(verbatim: str, own: list[str], shared: list[str]) -> list[tuple[str, bool]]:
    """Own and shared pieces (each list in caption order) merged in the order of the verbatim
    subcaption that joins them; (piece, is_own)."""
    out: list[tuple[str, bool]] = []
    cursor = 0
    i = j = 0
    at_own: int | None = None
    at_shared: int | None = None
    far = len(verbatim) + 1
    while i < len(own) or j < len(shared):
        if i < len(own) and at_own is None:
            piece = own[i]
            dangling = _DANGLING_RE.search(piece, max(0, len(piece) - 24))
            key = (piece[: dangling.start()] if dangling else piece).rstrip()
            found = verbatim.find(key, cursor)
            at_own = found if found >= 0 else far
        if j < len(shared) and at_shared is None:
            found = verbatim.find(shared[j], cursor)
            at_shared = found if found >= 0 else far
        if j >= len(shared) or (
            i < len(own) and at_own is not None and at_shared is not None and at_own <= at_shared
        ):
            out.append((own[i], True))
            if at_own is not None and at_own < far:
                cursor = at_own + 1
            i += 1
            at_own = None
        else:
            out.append((shared[j], False))
            if at_shared is not None and at_shared < far:
                cursor = at_shared + 1
            j += 1
            at_shared = None
    return out


_ENDS_CLAUSE_RE = re.compile(r"[.!?;:,]['\"\u201d)]?$")
# A preamble that stops mid-phrase ("... metabolites are from") takes no full stop.
_ENDS_OPEN_RE = re.compile(
    r"\b(?:from|of|in|with|by|for|the|a|an|to|at|on|as|between|into|under)$", re.IGNORECASE
)
