"""License strings as articles carry them, reduced to a canonical Creative Commons form and a group.

Publishers write the same license many ways: a creativecommons.org URL, a short code ("CC-BY",
"cc by-nc-nd 4.0") or a sentence ("distributed under the terms of the Creative Commons
Attribution License"). ``normalize_license`` turns each into "CC BY 4.0", "CC BY-NC-SA 3.0",
"CC0 1.0" or, without a version, "CC BY"; anything else comes back stripped but unchanged.
``license_group`` then sorts licenses the way BIOMEDICA does: CC0, public domain, CC BY, CC BY-SA
and CC BY-ND allow commercial use; any NC license is non-commercial; everything else is other.
"""

from __future__ import annotations

import re

from p2p.shared.db.models import LicenseGroup

# Canonical order of the license elements after BY.
_ELEMENT_ORDER = ("NC", "SA", "ND")

_URL_LICENSE = re.compile(
    r"creativecommons\.org/licenses/(?P<code>[a-z]+(?:-[a-z]+)*)(?:/(?P<version>\d+(?:\.\d+)?))?",
    re.IGNORECASE,
)
_URL_PUBLIC_DOMAIN = re.compile(r"creativecommons\.org/publicdomain/(?P<kind>zero|mark)", re.IGNORECASE)

# "CC BY", "CC-BY-NC-SA-4.0", "cc by nc nd 3.0", "CC BY 4.0 International"
_CODE = re.compile(
    r"(?<![a-z0-9])cc[\s_-]*(?P<code>by(?:[\s_-]*(?:nc|sa|nd)(?![a-z]))*)(?![a-z])"
    r"(?:[\s_-]*v?(?P<version>\d(?:\.\d)?)(?!\d))?",
    re.IGNORECASE,
)
# "CC0", "CC 0", "CC-0 1.0", "CC-Zero"
_CC0_CODE = re.compile(r"(?<![a-z0-9])cc[\s_-]?(?:0|zero)(?![a-z0-9])", re.IGNORECASE)

# The spelled-out names: "Creative Commons Attribution-NonCommercial-ShareAlike 4.0 International".
_CREATIVE_COMMONS = re.compile(r"creative[\s-]*commons", re.IGNORECASE)
_SPELLED_ZERO = re.compile(r"^\W*(?:cc\s*0|zero|public\s+domain\s+dedication|cc0)", re.IGNORECASE)
_SPELLED_ATTRIBUTION = re.compile(r"^\W*(?:\(cc\)\s*)?attribution", re.IGNORECASE)
_SPELLED_NC = re.compile(r"non[\s-]*commercial", re.IGNORECASE)
_SPELLED_SA = re.compile(r"share[\s-]*alike", re.IGNORECASE)
_SPELLED_ND = re.compile(r"no[\s-]*deriv", re.IGNORECASE)
_SPELLED_VERSION = re.compile(r"(?<![\d.])(\d\.\d)(?![\d])")
_SPELLED_END = re.compile(r"licen[cs]e|[.;()]\s|\bwhich\b|https?://", re.IGNORECASE)

_PUBLIC_DOMAIN_TEXT = re.compile(r"public[\s-]*domain", re.IGNORECASE)


def _version(raw: str | None) -> str | None:
    if not raw:
        return None
    return raw if "." in raw else f"{raw}.0"


def _canonical(elements: set[str], version: str | None) -> str | None:
    if elements - set(_ELEMENT_ORDER):
        return None
    if "SA" in elements and "ND" in elements:  # not a license that exists
        return None
    code = "-".join(["BY", *(e for e in _ELEMENT_ORDER if e in elements)])
    return f"CC {code} {version}" if version else f"CC {code}"


def _from_url(text: str) -> str | None:
    found: list[tuple[int, str]] = []
    for match in _URL_LICENSE.finditer(text):
        parts = match.group("code").upper().split("-")
        if parts[0] != "BY":
            continue
        canonical = _canonical(set(parts[1:]), _version(match.group("version")))
        if canonical:
            found.append((match.start(), canonical))
            break
    for match in _URL_PUBLIC_DOMAIN.finditer(text):
        kind = match.group("kind").lower()
        found.append((match.start(), "CC0 1.0" if kind == "zero" else "Public Domain Mark 1.0"))
        break
    return min(found)[1] if found else None


def _from_code(text: str) -> str | None:
    found: list[tuple[int, str]] = []
    match = _CODE.search(text)
    if match:
        parts = re.split(r"[\s_-]+", match.group("code").upper())
        canonical = _canonical(set(parts[1:]), _version(match.group("version")))
        if canonical:
            found.append((match.start(), canonical))
    zero = _CC0_CODE.search(text)
    if zero:
        found.append((zero.start(), "CC0 1.0"))
    return min(found)[1] if found else None


def _from_words(text: str) -> str | None:
    for match in _CREATIVE_COMMONS.finditer(text):
        rest = text[match.end() :]
        if _SPELLED_ZERO.search(rest):
            return "CC0 1.0"
        if not _SPELLED_ATTRIBUTION.search(rest):
            continue
        end = _SPELLED_END.search(rest)
        # The license name runs up to the word "License" or to the end of the clause, so words
        # further on ("commercial use is not permitted") do not change it.
        window = rest[: end.start() if end else 160][:160]
        elements = set()
        if _SPELLED_NC.search(window):
            elements.add("NC")
        if _SPELLED_SA.search(window):
            elements.add("SA")
        if _SPELLED_ND.search(window):
            elements.add("ND")
        version = _SPELLED_VERSION.search(window)
        canonical = _canonical(elements, version.group(1) if version else None)
        if canonical:
            return canonical
    return None


def normalize_license(text: str | None) -> str | None:
    """The canonical Creative Commons name of ``text``, or ``text`` stripped when it is not CC."""
    if text is None:
        return None
    stripped = " ".join(text.split())
    if not stripped:
        return None
    return _from_url(stripped) or _from_code(stripped) or _from_words(stripped) or text.strip()


def license_group(text: str | None) -> LicenseGroup:
    """BIOMEDICA's grouping: commercial use allowed, non-commercial only, or other/unknown."""
    canonical = normalize_license(text)
    if canonical is None:
        return LicenseGroup.OTHER
    if canonical.startswith("CC0") or canonical.startswith("Public Domain Mark"):
        return LicenseGroup.COMMERCIAL
    if canonical == "CC BY" or canonical.startswith(("CC BY ", "CC BY-")):
        elements = canonical.split(" ")[1].split("-")[1:]
        return LicenseGroup.NONCOMMERCIAL if "NC" in elements else LicenseGroup.COMMERCIAL
    if _PUBLIC_DOMAIN_TEXT.search(canonical):
        return LicenseGroup.COMMERCIAL
    return LicenseGroup.OTHER
