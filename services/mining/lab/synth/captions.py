"""Captions written from templates, with the subcaption ground truth of the real development set.

Conventions (those of /work/shared/data/real-figures/annotations.json):

* ``preamble`` is the text before the first panel label ('' if none).
* A labelled fragment starts with its label token ("(A)", "A,", "a", "(B, C)", "(D-F)", "b,c", ...;
  ranges use an en dash or a hyphen) at the start of the caption or of a sentence, and runs to the
  next fragment; inline references inside a fragment ("... (B) and ... (C)", "Arrows in C ...")
  do not start fragments.
* A fragment naming several panels goes to each of them (label token kept, text verbatim).
* Shared trailing sentences (after the last fragment) are separate pieces: one that names panels
  ("Scale bars, 50 µm (A, B) and 20 µm (C).", "Arrows in B and D ...") goes to each panel it names,
  one that names none goes to every labelled panel.
* The last fragment's own notes and the trailing sentences can look alike ("(D-F) ... Arrows in E
  mark X." is the same text whether the sentence was written as the fragment's note or after it),
  so where the last fragment ends follows the text: a sentence after it that names only panels of
  the last fragment, with no sentence before it naming another panel or none, stays with the last
  fragment (all its panels) like the fragment's own notes. The first sentence naming another panel
  ("Arrows in A and E ...") or naming none ("Scale bars, 1 mm.", "Data are ...") starts the shared
  part: from there each sentence goes to the panels it names, or to every labelled panel.
  The fragment's own unnamed notes ("Scale bar, 1 cm.", "Arrows indicate X.") stay its own: which
  panels a marker note is about the caption leaves open and the image settles (the panels that
  show such markers; the trailing marker sentences always name their panels).
* ``subcaptions[label]`` is the label's pieces joined by one space; every piece is a substring of the
  caption.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2p.mining.lab.synth import vocab

TOKEN_FORMATS = ("paren", "comma", "bare", "colon")
EN_DASH = "\u2013"
MATERIALS = (
    "Ag nanoparticles",
    f"Ag{EN_DASH}Pd nanocages",
    "hollow nanoshells",
    "manganese oxide nanoplates",
    "gold nanorods",
)


@dataclass
class MarkerMention:
    kind: str
    count: int
    colour: str
    dashed: bool = False


@dataclass
class PanelText:
    label: str | None
    type: str
    modality: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    markers: list[MarkerMention] = field(default_factory=list)
    scale_bar: str | None = None
    group: str | None = None
    row: int = 0


@dataclass
class CaptionResult:
    caption: str
    preamble: str
    pieces: dict[str, list[str]]
    subcaptions: dict[str, str]
    marker_phrases: dict[tuple[int, str], str]  # (panel index, kind) -> what the glyphs point at
    fragments: list[dict[str, Any]]
    trailing: list[dict[str, Any]]
    token_format: str


def _plural(word: str, n: int) -> str:
    if n == 1:
        return word
    if word.endswith("y") and not word.endswith("ey"):
        return word[:-1] + "ies"
    if word.endswith(("s", "x")):
        return word + "es"
    return word + "s"


def _join_refs(labels: list[str], rng: np.random.Generator, seq: list[str]) -> str:
    """Inline reference to panels: "C", "B and D", "b,d", "D-F" (en dash)."""
    if len(labels) == 1:
        return labels[0]
    idx = [seq.index(lab) for lab in labels]
    if len(labels) >= 3 and idx == list(range(idx[0], idx[0] + len(idx))):
        return f"{labels[0]}{EN_DASH}{labels[-1]}"
    if len(labels) == 2:
        return f"{labels[0]} and {labels[1]}" if rng.random() < 0.6 else f"{labels[0]},{labels[1]}"
    return ", ".join(labels[:-1]) + f" and {labels[-1]}"


def _token(labels: list[str], seq: list[str], fmt: str, rng: np.random.Generator) -> str:
    idx = [seq.index(lab) for lab in labels]
    consecutive = idx == list(range(idx[0], idx[0] + len(idx)))
    if len(labels) == 1:
        core = labels[0]
    elif consecutive and (len(labels) >= 3 or rng.random() < 0.1):
        core = f"{labels[0]}{EN_DASH if rng.random() < 0.75 else '-'}{labels[-1]}"
    else:
        sep = str(rng.choice([", ", ","])) if fmt != "comma" else ", "
        if len(labels) == 2 and fmt in ("paren", "colon") and rng.random() < 0.25:
            sep = " and "
        core = sep.join(labels)
    if fmt == "paren":
        return f"({core})"
    if fmt == "colon":
        return f"({core}):"
    if fmt == "comma":
        return f"{core},"
    return core


def _image_desc(rng: np.random.Generator, modality: str, n: int) -> str:
    s = "s" if n > 1 else ""
    p = vocab.pick(rng, vocab.PROTEINS)
    t = vocab.pick(rng, vocab.TISSUES)
    c = vocab.pick(rng, vocab.CELLS)
    if modality == "ihc":
        return vocab.pick(
            rng,
            (
                f"Immunohistochemical staining for {p} in sections of the {t}",
                f"Representative IHC image{s} of {p} in the {t}",
            ),
        )
    if modality == "phase":
        return f"Phase-contrast image{s} of {c} {vocab.pick(rng, vocab.CONDITIONS)}"
    if modality == "fundus":
        return f"Colour fundus photograph{s} showing {vocab.pick(rng, vocab.FINDINGS['fundus'])}"
    if modality == "fluorescence":
        return vocab.pick(
            rng,
            (
                f"Immunofluorescence staining of {p} and DAPI (blue) in {c}",
                f"Confocal image{s} of {c} stained for {p}",
            ),
        )
    if modality == "em":
        m = vocab.pick(rng, MATERIALS)
        return vocab.pick(
            rng, (f"TEM image{s} of the {m}", f"HR-TEM image{s} of the {m}", f"SEM image{s} of {m}")
        )
    if modality == "ct":
        return f"Axial CT image{s} showing {vocab.pick(rng, vocab.FINDINGS['ct'])}"
    if modality == "mri":
        return vocab.pick(
            rng,
            (
                f"T2-weighted MR image{s} demonstrating {vocab.pick(rng, vocab.FINDINGS['mri'])}",
                f"Sagittal T1-weighted MRI scan{s} of the head",
            ),
        )
    if modality == "ultrasound":
        return f"Doppler ultrasound image{s} showing {vocab.pick(rng, vocab.FINDINGS['ultrasound'])}"
    if modality == "blot":
        return f"Western blot analysis of {p} in lysates of {c}"
    if modality == "map":
        return f"Shaded-relief map{s} of the study area"
    return f"Photograph{s} of the experimental set-up"


def _panel_desc(rng: np.random.Generator, panel: PanelText, n: int = 1) -> str:
    if panel.type == "image":
        return _image_desc(rng, panel.modality or "em", n)
    info = panel.info
    if panel.type == "plot":
        kind, q = info.get("kind"), info.get("quantity", "the measured signal")
        groups = info.get("groups") or ["control", "treated"]
        gtext = ", ".join(groups[:-1]) + f" and {groups[-1]}" if len(groups) > 1 else groups[0]
        if kind == "bar":
            return f"Quantification of {q} in {gtext} groups"
        if kind == "line":
            return f"Time course of {q} in {gtext} groups"
        if kind == "scatter":
            return f"Correlation between {info.get('x', 'TP53')} and {info.get('y', 'MYC')} expression"
        if kind == "heatmap":
            return f"Heat map of {q} for selected genes across samples"
        if kind == "hist":
            return f"Distribution of {q}"
        if kind == "spectrum":
            return f"{q[0].upper()}{q[1:]} of the {vocab.pick(rng, MATERIALS)}"
        if kind == "box":
            return f"Box plots of {q} ({gtext})"
        return f"Kaplan{EN_DASH}Meier curves of {q} for {gtext} patients"
    if panel.type == "schematic":
        return vocab.pick(
            rng,
            (
                "Schematic of the experimental workflow",
                "Schematic representation of the proposed mechanism",
                "Overview of the study design",
                "Flow chart of patient inclusion",
            ),
        )
    return vocab.pick(rng, ("Summary of patient characteristics", "Baseline characteristics of the cohort"))


def _preamble(rng: np.random.Generator, panels: list[PanelText]) -> str:
    """A preamble template that fits what the panels show. One draw over the whole list as before,
    then a template that does not fit is swapped for a fitting one, so captions whose preamble
    already fit (and every later draw) are unchanged."""
    drawn = vocab.pick(rng, vocab.PREAMBLES)
    shown = {p.modality for p in panels if p.type == "image"}
    fitting = [t for t in vocab.PREAMBLES if _preamble_fits(t, shown)]
    if _preamble_fits(drawn, shown) or not fitting:
        return drawn
    return fitting[vocab.PREAMBLES.index(drawn) % len(fitting)]


def _preamble_fits(template: str, shown: set[str | None]) -> bool:
    if template == vocab.NANO_PREAMBLE:
        return "em" in shown
    if "em" in shown:  # electron micrographs of nanomaterials: only the nanostructure preamble
        return False
    clinical = vocab.CLINICAL_PREAMBLES.get(template)
    return clinical is None or (bool(shown) and shown <= clinical)


def _group_phrase(rng: np.random.Generator, group: str | None) -> str:
    if group == "stack":
        return vocab.pick(
            rng,
            ("; upper, low magnification; lower, high magnification", " (upper, overview; lower, detail)"),
        )
    if group == "strip":
        return vocab.pick(
            rng, ("; left to right, increasing magnification", " (left, overview; right, detail)")
        )
    if group == "big_small":
        return "; right, higher magnification of two selected areas"
    return ""


# kind -> variants of (singular noun, plural noun, singular verb, plural verb)
MARKER_WORDS = {
    "arrow": (("arrow", "arrows", "indicates", "indicate"), ("arrow", "arrows", "points to", "point to")),
    "arrowhead": (
        ("arrowhead", "arrowheads", "marks", "mark"),
        ("arrowhead", "arrowheads", "indicates", "indicate"),
    ),
    "asterisk": (("asterisk", "asterisks", "marks", "mark"), ("asterisk", "asterisks", "denotes", "denote")),
    "star": (("star", "stars", "indicates", "indicate"), ("star", "stars", "marks", "mark")),
    "box": (("box", "boxes", "outlines", "outline"), ("boxed area", "boxed areas", "shows", "show")),
    "circle": (
        ("circle", "circles", "highlights", "highlight"),
        ("circle", "circles", "outlines", "outline"),
    ),
}


def _marker_sentence(
    rng: np.random.Generator,
    kind: str,
    count: int,
    phrase: str,
    refs: str | None,
    colour: str | None,
    dashed: bool,
) -> str:
    where = f" in {refs}" if refs else ""
    if kind == "inset":
        if rng.random() < 0.5:
            return f"{'Insets' if count > 1 else 'Inset'}{where}: higher magnification of {phrase}."
        verb = "show" if count > 1 else "shows"
        return f"The {'insets' if count > 1 else 'inset'}{where} {verb} {phrase} at higher magnification."
    variants = MARKER_WORDS[kind]
    one, many, verb1, verb_n = variants[int(rng.integers(len(variants)))]
    noun, verb = (many, verb_n) if count > 1 else (one, verb1)
    adjective = ""
    if kind in ("box", "circle") and dashed:
        adjective = "dashed "
    elif colour and rng.random() < 0.35:
        adjective = colour + " "
    sentence = f"{adjective}{noun}{where} {verb} {phrase}."
    return sentence[0].upper() + sentence[1:]


def _phrase(rng: np.random.Generator, panel: PanelText) -> str:
    mod = panel.modality or "em"
    if mod in vocab.STRUCTURES:
        return vocab.pick(rng, vocab.STRUCTURES[mod])
    return vocab.pick(rng, vocab.FINDINGS.get(mod, ("the region of interest",)))


def build_caption(
    rng: np.random.Generator,
    panels: list[PanelText],
    sequence: list[str],
    *,
    token_format: str | None = None,
    preamble: bool | None = None,
) -> CaptionResult:
    labelled = [p for p in panels if p.label is not None]
    fmt = token_format or str(rng.choice(TOKEN_FORMATS, p=[0.45, 0.2, 0.25, 0.1]))
    if fmt == "bare" and not all(lab.isalpha() and lab.islower() and len(lab) == 1 for lab in sequence):
        fmt = "paren"
    if fmt == "comma" and any(lab in vocab_roman() for lab in sequence):
        fmt = "paren"
    want_pre = preamble if preamble is not None else bool(rng.random() < 0.75)
    pre = ""
    if want_pre or not labelled:
        pre = _preamble(rng, panels).format(
            protein=vocab.pick(rng, vocab.PROTEINS),
            tissue=vocab.pick(rng, vocab.TISSUES),
            gene=vocab.pick(rng, vocab.GENES),
            cells=vocab.pick(rng, vocab.CELLS),
        )
        if rng.random() < 0.25:
            pre += " " + vocab.pick(
                rng,
                (
                    "Images are representative of three independent experiments.",
                    "All samples were processed in parallel.",
                ),
            )

    # Marker phrases: one per (panel, kind); an inset and its source box share a phrase.
    phrases: dict[tuple[int, str], str] = {}
    by_modality: dict[tuple[str, str], str] = {}
    for i, p in enumerate(panels):
        for m in p.markers:
            key = (p.modality or "", "inset" if m.kind == "box" and _has_inset(p) else m.kind)
            if key not in by_modality:
                by_modality[key] = _phrase(rng, p)
            phrases[(i, m.kind)] = by_modality[key]
            if m.kind == "box" and _has_inset(p):
                phrases[(i, "box")] = by_modality[key]

    if not labelled:  # no printed labels: the whole caption is preamble
        sentences = [pre]
        for p in panels:
            sentences.append(_panel_desc(rng, p) + ".")
        caption = " ".join(s for s in sentences if s)
        return CaptionResult(
            caption, caption, {"preamble": [caption]}, {"preamble": caption}, {}, [], [], fmt
        )

    marker_mode = "trailing" if rng.random() < 0.25 else "inline"
    bar_mode = str(rng.choice(["inline", "trailing", "none"], p=[0.4, 0.45, 0.15]))

    # Fragments: runs of consecutive panels of one type (and modality) may share a fragment.
    fragments: list[list[int]] = []
    index = {id(p): i for i, p in enumerate(panels)}
    order = [index[id(p)] for p in labelled]
    for i in order:
        p = panels[i]
        if fragments:
            last = panels[fragments[-1][-1]]
            same = (
                last.type == p.type and last.modality == p.modality and p.group is None and last.group is None
            )
            if same and len(fragments[-1]) < 4 and rng.random() < 0.5:
                fragments[-1].append(i)
                continue
        fragments.append([i])
    # One fragment for a time series / grid, "(A-L) ...", only when one description fits every
    # panel: the draw is made either way so the other figures of a seed stay as they were.
    grid = len(order) >= 4 and all(panels[i].type == "image" for i in order) and rng.random() < 0.2
    if grid and len({panels[i].modality for i in order}) == 1:
        fragments = [order]

    mentioned: set[tuple[int, str]] = set()
    frag_texts: list[str] = []
    frag_meta: list[dict[str, Any]] = []
    frag_sentences: list[list[str]] = []  # each fragment's sentences, the first with its token
    # The panels each of them names (None: none) and its kind ("description", "bar", "marker").
    frag_names: list[list[tuple[list[str] | None, str]]] = []
    for frag in fragments:
        labs = [panels[i].label or "" for i in frag]
        tok = _token(labs, sequence, fmt, rng)
        first = panels[frag[0]]
        if len(frag) > 1 and first.type == "image":
            desc = _panel_desc(rng, first, len(frag))
            rows = sorted({panels[i].row for i in frag})
            if len(rows) == 2 and rng.random() < 0.5:
                desc += vocab.pick(
                    rng,
                    (
                        "; upper row, control; lower row, treated",
                        " in control (upper) and treated (lower) samples",
                    ),
                )
            elif rng.random() < 0.3:
                conds = [
                    f"{vocab.CONDITIONS[k % len(vocab.CONDITIONS)]} ({lab})" for k, lab in enumerate(labs)
                ]
                desc += "; " + ", ".join(conds[:-1]) + f" and {conds[-1]}"
        elif len(frag) > 1:
            descs = [_panel_desc(rng, panels[i]) for i in frag]
            parts = [f"{_decap(d)} ({lab})" for d, lab in zip(descs, labs, strict=True)]
            head = parts[0][0].upper() + parts[0][1:]
            desc = head if len(parts) == 1 else ", ".join([head, *parts[1:-1]]) + f" and {parts[-1]}"
            if len(parts) == 2:
                desc = f"{head} and {parts[1]}"
        else:
            desc = _panel_desc(rng, first) + _group_phrase(rng, first.group)
        sentences = [desc]
        names: list[tuple[list[str] | None, str]] = [(labs, "description")]
        if bar_mode == "inline":
            bars = [(panels[i].scale_bar, panels[i].label) for i in frag if panels[i].scale_bar]
            if bars:
                values = sorted({str(b) for b, _ in bars})
                if len(values) == 1 and rng.random() < 0.5:
                    sentences[0] += f"; scale {'bars' if len(bars) > 1 else 'bar'}, {values[0]}"
                elif len(values) == 1:
                    sentences.append(f"Scale {'bars' if len(bars) > 1 else 'bar'}, {values[0]}")
                    names.append((None, "bar"))
                else:
                    sentences.append("Scale bars, " + _valued_refs(bars, rng, sequence))
                    names.append(([lab or "" for _, lab in bars], "bar"))
        if marker_mode == "inline":
            for sentence, named in _fragment_marker_sentences(
                rng, panels, frag, phrases, sequence, mentioned
            ):
                sentences.append(sentence)
                names.append((named, "marker"))
        text = ". ".join(s.rstrip(".") for s in sentences) + "."
        frag_texts.append(f"{tok} {text}")
        frag_meta.append({"token": tok, "labels": labs})
        frag_sentences.append(
            [(f"{tok} " if k == 0 else "") + s.rstrip(".") + "." for k, s in enumerate(sentences)]
        )
        frag_names.append(names)

    trailing: list[tuple[str, list[str]]] = []
    unnamed: set[str] = set()  # trailing sentences that name no panel (for every panel)
    all_labels = [panels[i].label or "" for i in order]
    if bar_mode == "trailing":
        bars = [(panels[i].scale_bar, panels[i].label) for i in order if panels[i].scale_bar]
        if bars:
            values = sorted({str(b) for b, _ in bars})
            named = [lab or "" for _, lab in bars]
            if len(values) == 1 and len(bars) == len(order):
                trailing.append((f"Scale {'bars' if len(bars) > 1 else 'bar'}, {values[0]}.", all_labels))
                unnamed.add(trailing[-1][0])
            elif len(values) == 1:
                refs = _join_refs(named, rng, sequence)
                trailing.append((f"Scale {'bars' if len(bars) > 1 else 'bar'}, {values[0]} ({refs}).", named))
            else:
                trailing.append(("Scale bars, " + _valued_refs(bars, rng, sequence) + ".", named))
    if marker_mode == "trailing":
        kinds: dict[tuple[str, str], list[int]] = {}
        for i in order:
            for m in panels[i].markers:
                if m.kind == "box" and _has_inset(panels[i]):
                    continue
                kinds.setdefault((m.kind, phrases[(i, m.kind)]), []).append(i)
        for (kind, phrase), idxs in kinds.items():
            labs = [panels[i].label or "" for i in idxs]
            count = sum(m.count for i in idxs for m in panels[i].markers if m.kind == kind)
            colours = {m.colour for i in idxs for m in panels[i].markers if m.kind == kind}
            dashed = all(m.dashed for i in idxs for m in panels[i].markers if m.kind == kind)
            sentence = _marker_sentence(
                rng,
                kind,
                count,
                phrase,
                _join_refs(labs, rng, sequence),
                colours.pop() if len(colours) == 1 else None,
                dashed,
            )
            trailing.append((sentence, labs))
            mentioned.update((i, kind) for i in idxs)
    plots = [panels[i].label or "" for i in order if panels[i].type == "plot"]
    if plots and rng.random() < 0.5:
        stat = vocab.pick(
            rng,
            (
                "mean ± s.e.m",
                "mean ± s.d. of three independent experiments",
                "median with interquartile range",
            ),
        )
        if len(plots) == len(order):
            trailing.append((f"Data are {stat}.", all_labels))
            unnamed.add(trailing[-1][0])
        else:
            trailing.append((f"Data in {_join_refs(plots, rng, sequence)} are {stat}.", plots))

    parts = ([pre] if pre else []) + frag_texts + [t for t, _ in trailing]
    caption = " ".join(parts)
    pieces: dict[str, list[str]] = {"preamble": [pre] if pre else []}
    for lab in all_labels:
        pieces[lab] = []
    for frag, text in zip(fragments[:-1], frag_texts[:-1], strict=True):
        for i in frag:
            pieces[panels[i].label or ""].append(text)
    after_last = [(text, *named) for text, named in zip(frag_sentences[-1], frag_names[-1], strict=True)][1:]
    after_last += [(text, None if text in unnamed else labs, "trailing") for text, labs in trailing]
    group = [panels[i].label or "" for i in fragments[-1]]
    head = frag_sentences[-1][0]
    for text, labs in _last_fragment_pieces(head, after_last, group, all_labels):
        for lab in labs:
            if text not in pieces[lab]:
                pieces[lab].append(text)
    subcaptions = {"preamble": pre} | {lab: " ".join(pieces[lab]) for lab in all_labels}
    for i, p in enumerate(panels):  # an inset's source box is described by the inset's sentence
        if (i, "inset") in mentioned and _has_inset(p):
            mentioned.add((i, "box"))
    return CaptionResult(
        caption=caption,
        preamble=pre,
        pieces=pieces,
        subcaptions=subcaptions,
        marker_phrases={k: v for k, v in phrases.items() if k in mentioned},
        fragments=frag_meta,
        trailing=[{"text": t, "labels": labs} for t, labs in trailing],
        token_format=fmt,
    )


def _last_fragment_pieces(
    head: str,
    after: list[tuple[str, list[str] | None, str]],
    group: list[str],
    all_labels: list[str],
) -> list[tuple[str, list[str]]]:
    """Who gets the sentences after the last fragment's first one (the rule of the docstring).

    ``head``: the fragment's first sentence, token included; ``after``: (sentence, panels it names
    or None, kind: "bar" / "marker" written in the fragment, "trailing" after it) in caption order.
    Returns (piece, labels) in caption order, the group's own text first.
    """
    own = [head]
    out: list[tuple[str, list[str]]] = []
    shared = False
    for text, names, kind in after:
        if not shared:
            if names is not None and set(names) <= set(group):
                own.append(text)  # "(C, D) ... Arrows in C ...": the group's own note
                continue
            if names is None and kind != "trailing":
                # "Scale bar, 1 cm."; "Arrows indicate X.": the caption leaves open which panels
                # such a marker note is about, the image settles it (the panels that show them).
                own.append(text)
                continue
            shared = True
        out.append((text, names if names is not None else all_labels))
    return [(" ".join(own), group), *out]


def _decap(text: str) -> str:
    """Lower-case the first letter unless the first word is an acronym or a name."""
    first = text.split(" ", 1)[0]
    if (
        len(first) > 1
        and first[1:].islower()
        and first not in (f"Kaplan{EN_DASH}Meier", "Western", "Doppler")
    ):
        return text[0].lower() + text[1:]
    return text


def _has_inset(panel: PanelText) -> bool:
    return any(m.kind == "inset" for m in panel.markers)


def vocab_roman() -> tuple[str, ...]:
    from p2p.mining.lab.synth.labels import ROMAN

    return ROMAN


def _valued_refs(bars: list[tuple[str | None, str | None]], rng: np.random.Generator, seq: list[str]) -> str:
    """'50 µm (A, B) and 20 µm (C)' from (value, label) pairs, values in first-seen order."""
    values: dict[str, list[str]] = {}
    for value, lab in bars:
        values.setdefault(value or "", []).append(lab or "")
    parts = []
    for value, labs in values.items():
        refs = ", ".join(labs) if len(labs) < 3 else _join_refs(labs, rng, seq)
        parts.append(f"{value} ({refs})")
    return ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]


def _fragment_marker_sentences(
    rng: np.random.Generator,
    panels: list[PanelText],
    frag: list[int],
    phrases: dict[tuple[int, str], str],
    seq: list[str],
    mentioned: set[tuple[int, str]],
) -> list[tuple[str, list[str] | None]]:
    """The fragment's marker sentences, each with the panels it names (None: names none)."""
    kinds: dict[tuple[str, str], list[int]] = {}
    for i in frag:
        for m in panels[i].markers:
            if m.kind == "box" and _has_inset(panels[i]):
                continue
            kinds.setdefault((m.kind, phrases[(i, m.kind)]), []).append(i)
    out = []
    for (kind, phrase), idxs in kinds.items():
        if rng.random() < 0.1:  # some glyphs go unmentioned, as in real captions
            continue
        named = None if len(idxs) == len(frag) else [panels[i].label or "" for i in idxs]
        refs = None if named is None else _join_refs(named, rng, seq)
        count = sum(m.count for i in idxs for m in panels[i].markers if m.kind == kind)
        colours = {m.colour for i in idxs for m in panels[i].markers if m.kind == kind}
        dashed = all(m.dashed for i in idxs for m in panels[i].markers if m.kind == kind)
        sentence = _marker_sentence(
            rng, kind, count, phrase, refs, colours.pop() if len(colours) == 1 else None, dashed
        )
        out.append((sentence, named))
        mentioned.update((i, kind) for i in idxs)
    return out
