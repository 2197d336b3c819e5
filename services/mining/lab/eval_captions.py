"""Score the caption splitter against hand-split captions, next to two naive baselines.

``python -m p2p.mining.lab.eval_captions --prostate PATH --real PATH --out FILE``

* ``--prostate``: ``prostate.jsonl`` (one JSON object a line: ``id``, ``caption``, ``labels``,
  ``subcaptions``; convention: preamble prepended, label markers removed). The splitter runs
  with ``labels`` = the record's labels and is compared through ``to_prostate_convention``.
* ``--real``: ``real-figures/annotations.json`` or ``real-dev/annotations.json`` (file name ->
  entry with ``caption``, ``panels[].label`` and ``subcaptions``; verbatim convention, label
  tokens kept, the ``"preamble"`` key is not a panel). The splitter runs with labels = the TRUE
  panel labels (what a perfect label reader would hand it). ``--split tune`` (or ``check``) scores
  only the figures of that split of the ``splits.json`` next to the annotations (real-dev):
  ``python -m p2p.mining.lab.eval_captions --real ../shared/data/real-dev/annotations.json
  --split tune``.

Metrics, per (caption, label) pair, averaged over all pairs:

* exact: the strings are equal after normalisation;
* token F1: SQuAD-style bag-of-tokens F1 (multiset overlap of whitespace tokens) after
  normalisation. Tokens are NOT lower-cased and punctuation is kept: both sides are cut from
  the same verbatim caption, so case and punctuation differences are real differences
  ("A" the label vs "a" the article, "p53" vs "P53"). Both empty -> 1, one empty -> 0.

Normalisation (both sides): parenthesised label markers naming only labels of the record
("(A)", "(a,b)", "(B-D)", "((a), (b))", and groups joined into one marker such as "(E) and (F)")
are removed, whitespace runs become one space, spaces before ".,;:" are dropped, ends are
stripped. A label the method does not return scores 0 (exact and F1).

Also reported: ``captions_all_exact`` (captions whose every label is exact), ``pairs`` and
``ms_per_caption``; ``--failures N`` keeps the N worst pairs (normalised prediction and truth).

Baselines: ``whole_caption`` gives every panel the whole caption; ``paren_split`` cuts the
caption at the first "(X)" of each label X only (preamble = text before the first cut; no
ranges, lists, bare labels or shared trailing text).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2p.mining.captions import expand_label_expression, split_caption, to_prostate_convention

# (caption, labels) -> label -> predicted subcaption
Method = Callable[[str, list[str]], dict[str, str]]

# One parenthesised group, or several joined into one marker: "(E) and (F)", "(B), (C), and (D)".
_PAREN_GROUP_RE = re.compile(
    r"[(\[][^()\[\]]{1,80}[)\]](?:\s{0,3}(?:,\s{0,3}and|,|and|or|&|-|\u2013)\s{0,3}[(\[][^()\[\]]{1,80}[)\]]){0,30}"
)
_ONE_GROUP_RE = re.compile(r"[(\[][^()\[\]]{1,80}[)\]]")
_NESTED_GROUP_RE = re.compile(r"\(\s*(\([^()]{1,10}\)(?:\s*(?:,|and|&|-|\u2013)\s*\([^()]{1,10}\))+)\s*\)")


def normalize_for_compare(text: str, labels: list[str]) -> str:
    """Drop parenthesised markers of the given labels, collapse whitespace, no space before .,;:"""
    low = {lab.lower() for lab in labels}

    def is_marker(group: str) -> bool:
        named = expand_label_expression(group)
        return bool(named) and all(n.lower() in low for n in named)

    def drop(m: re.Match[str]) -> str:
        groups = _ONE_GROUP_RE.findall(m.group(0))
        if groups and all(is_marker(g) for g in groups):
            return " "
        if len(groups) > 1:  # only some groups are markers: drop those one by one
            return _ONE_GROUP_RE.sub(lambda g: " " if is_marker(g.group(0)) else g.group(0), m.group(0))
        return m.group(0)

    text = _NESTED_GROUP_RE.sub(lambda m: " " if is_marker(m.group(0)) else m.group(0), text or "")
    text = _PAREN_GROUP_RE.sub(drop, text)
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r" ([.,;:])", r"\1", text)
    return text.strip()


def token_f1(prediction: str, truth: str) -> float:
    """Bag-of-tokens F1 over whitespace tokens (case and punctuation kept)."""
    pred = prediction.split()
    gold = truth.split()
    if not pred and not gold:
        return 1.0
    if not pred or not gold:
        return 0.0
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred)
    recall = common / len(gold)
    return 2 * precision * recall / (precision + recall)


def _score(
    records: list[tuple[str, str, list[str], dict[str, str]]], method: Method, keep_failures: int = 0
) -> dict[str, Any]:
    exact = 0
    f1_sum = 0.0
    pairs = 0
    captions_exact = 0
    failures: list[dict[str, Any]] = []
    elapsed = 0.0
    for rec_id, caption, labels, truth in records:
        t0 = time.perf_counter()
        predicted = method(caption, labels)
        elapsed += time.perf_counter() - t0
        all_exact = True
        for label, gold in truth.items():
            gold_n = normalize_for_compare(gold, labels)
            pred_raw = predicted.get(label)
            pred_n = normalize_for_compare(pred_raw, labels) if pred_raw is not None else None
            f1 = token_f1(pred_n, gold_n) if pred_n is not None else 0.0
            is_exact = pred_n is not None and pred_n == gold_n
            exact += is_exact
            all_exact &= is_exact
            f1_sum += f1
            pairs += 1
            if not is_exact and keep_failures:
                failures.append(
                    {"id": rec_id, "label": label, "f1": round(f1, 4), "pred": pred_n, "gold": gold_n}
                )
        captions_exact += all_exact
    failures.sort(key=lambda f: f["f1"])
    out: dict[str, Any] = {
        "exact": exact / pairs if pairs else 0.0,
        "token_f1": f1_sum / pairs if pairs else 0.0,
        "captions_all_exact": captions_exact / len(records) if records else 0.0,
        "pairs": pairs,
        "ms_per_caption": 1000 * elapsed / len(records) if records else 0.0,
    }
    if keep_failures:
        out["failures"] = failures[:keep_failures]
    return out


def whole_caption_baseline(caption: str, labels: list[str]) -> dict[str, str]:
    return {label: caption for label in labels}


def _paren_cuts(caption: str, labels: list[str]) -> tuple[str, list[tuple[str, int, int]]]:
    """First "(X)" of each label, in caption order: (label, marker start, marker end)."""
    cuts = []
    for label in labels:
        m = re.search(r"\(" + re.escape(label) + r"\)", caption)
        if m:
            cuts.append((label, m.start(), m.end()))
    cuts.sort(key=lambda c: c[1])
    preamble = caption[: cuts[0][1]].strip() if cuts else caption.strip()
    return preamble, cuts


def paren_split_baseline_prostate(caption: str, labels: list[str]) -> dict[str, str]:
    preamble, cuts = _paren_cuts(caption, labels)
    out = {label: preamble for label in labels}
    for i, (label, _, end) in enumerate(cuts):
        stop = cuts[i + 1][1] if i + 1 < len(cuts) else len(caption)
        out[label] = (preamble + " " + caption[end:stop].strip()).strip()
    return out


def paren_split_baseline_verbatim(caption: str, labels: list[str]) -> dict[str, str]:
    _, cuts = _paren_cuts(caption, labels)
    out = {label: "" for label in labels}
    for i, (label, start, _) in enumerate(cuts):
        stop = cuts[i + 1][1] if i + 1 < len(cuts) else len(caption)
        out[label] = caption[start:stop].strip()
    return out


# The records' labels are annotations of every panel, not OCR readings that may miss some.
def splitter_prostate(caption: str, labels: list[str]) -> dict[str, str]:
    split = split_caption(caption, labels=labels, divide_members=True, labels_complete=True)
    return to_prostate_convention(split)


def splitter_verbatim(caption: str, labels: list[str]) -> dict[str, str]:
    return split_caption(caption, labels=labels, labels_complete=True).subcaptions


def load_prostate(path: Path) -> list[tuple[str, str, list[str], dict[str, str]]]:
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            rec = json.loads(line)
            records.append(
                (str(rec.get("id", "")), rec["caption"], list(rec["labels"]), dict(rec["subcaptions"]))
            )
    return records


def load_real_figures(
    path: Path, split: str | None = None
) -> list[tuple[str, str, list[str], dict[str, str]]]:
    """(name, caption, true labels, true subcaptions) of each figure with a caption; with ``split``
    only the figures that ``splits.json`` (next to the annotations) lists under it."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    names: set[str] | None = None
    if split is not None:
        names = set(split_names(Path(path).parent, split))
    records = []
    for name, entry in data.items():
        if name.startswith("_") or not isinstance(entry, dict) or not entry.get("caption"):
            continue
        if names is not None and name not in names:
            continue
        labels = [p["label"] for p in entry.get("panels", []) if p.get("label")]
        truth = {k: v for k, v in entry.get("subcaptions", {}).items() if k != "preamble"}
        records.append((name, entry["caption"], labels, truth))
    return records


def evaluate_prostate(path: Path, keep_failures: int = 0) -> dict[str, Any]:
    """Splitter (through ``to_prostate_convention``) and both baselines on prostate.jsonl."""
    records = load_prostate(Path(path))
    return {
        "captions": len(records),
        "subcaptions": sum(len(r[3]) for r in records),
        "splitter": _score(records, splitter_prostate, keep_failures),
        "baseline_whole_caption": _score(records, whole_caption_baseline),
        "baseline_paren_split": _score(records, paren_split_baseline_prostate),
    }


def split_names(folder: Path, split: str) -> list[str]:
    """The figure names of one split in the folder's ``splits.json`` (as real-dev has it)."""
    path = folder / "splits.json"
    if not path.is_file():
        raise ValueError(f"{folder} has no splits.json: a split needs one")
    splits = json.loads(path.read_text(encoding="utf-8"))
    if split.startswith("_") or split not in splits:
        known = ", ".join(k for k in splits if not k.startswith("_"))
        raise ValueError(f"split {split!r} is not in {path} (it has: {known})")
    return list(splits[split])


def evaluate_real_figures(
    annotations_path: Path, keep_failures: int = 0, split: str | None = None
) -> dict[str, Any]:
    """Splitter (verbatim ``subcaptions``, true panel labels) and both baselines on real
    annotations (real-figures, or one split of real-dev)."""
    records = load_real_figures(Path(annotations_path), split)
    data = json.loads(Path(annotations_path).read_text(encoding="utf-8"))
    preamble_exact = 0
    for name, caption, labels, _ in records:
        gold = data[name].get("subcaptions", {}).get("preamble", "")
        got = split_caption(caption, labels=labels, labels_complete=True).preamble
        preamble_exact += normalize_for_compare(got, []) == normalize_for_compare(gold, [])
    return {
        "captions": len(records),
        "subcaptions": sum(len(r[3]) for r in records),
        "splitter": _score(records, splitter_verbatim, keep_failures),
        "preamble_exact": preamble_exact / len(records) if records else 0.0,
        "baseline_whole_caption": _score(records, whole_caption_baseline),
        "baseline_paren_split": _score(records, paren_split_baseline_verbatim),
    }


def _table(results: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'dataset':<14}{'method':<26}{'exact':>8}{'token F1':>10}{'ms/caption':>12}"]
    for dataset, res in results.items():
        for method in ("splitter", "baseline_whole_caption", "baseline_paren_split"):
            r = res[method]
            lines.append(
                f"{dataset:<14}{method:<26}{r['exact']:>8.3f}{r['token_f1']:>10.3f}{r['ms_per_caption']:>12.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Score the caption splitter and two baselines.")
    parser.add_argument("--prostate", type=Path, help="prostate.jsonl (preamble-prepended convention)")
    parser.add_argument("--real", type=Path, help="real-figures annotations.json (verbatim convention)")
    parser.add_argument(
        "--split", help="with --real: only this split of the splits.json next to it (tune, check)"
    )
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--failures", type=int, default=0, help="keep the N worst pairs per dataset")
    args = parser.parse_args(argv)
    if not args.prostate and not args.real:
        parser.error("give --prostate and/or --real")
    results: dict[str, dict[str, Any]] = {}
    if args.prostate:
        results["prostate"] = evaluate_prostate(args.prostate, args.failures)
    if args.real:
        try:
            results["real_figures"] = evaluate_real_figures(args.real, args.failures, args.split)
        except ValueError as exc:
            parser.error(str(exc))
    print(_table(results))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
