from __future__ import annotations

import pytest

from p2p.shared.db.models import LicenseGroup
from p2p.shared.licenses import license_group, normalize_license

BMC_TEXT = (
    "This is an Open Access article distributed under the terms of the Creative Commons Attribution "
    "License (http://creativecommons.org/licenses/by/4.0), which permits unrestricted use, distribution, "
    "and reproduction in any medium, provided the original work is properly credited. The Creative "
    "Commons Public Domain Dedication waiver (http://creativecommons.org/publicdomain/zero/1.0/) applies "
    "to the data made available in this article, unless otherwise stated."
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # URLs
        ("http://creativecommons.org/licenses/by-nc-sa/4.0/", "CC BY-NC-SA 4.0"),
        ("https://creativecommons.org/licenses/by/4.0/", "CC BY 4.0"),
        ("https://creativecommons.org/licenses/by/4.0/legalcode", "CC BY 4.0"),
        ("https://creativecommons.org/licenses/by-nc-nd/3.0/igo/", "CC BY-NC-ND 3.0"),
        ("http://creativecommons.org/licenses/by/2.0", "CC BY 2.0"),
        ("http://creativecommons.org/licenses/by-sa/4.0/deed.en", "CC BY-SA 4.0"),
        ("https://creativecommons.org/licenses/by-nd/4.0", "CC BY-ND 4.0"),
        ("HTTPS://CreativeCommons.org/licenses/BY-NC/4.0/", "CC BY-NC 4.0"),
        ("https://creativecommons.org/licenses/by/", "CC BY"),
        ("http://creativecommons.org/publicdomain/zero/1.0/", "CC0 1.0"),
        ("https://creativecommons.org/publicdomain/mark/1.0/", "Public Domain Mark 1.0"),
        # codes
        ("CC BY 4.0", "CC BY 4.0"),
        ("CC-BY", "CC BY"),
        ("cc by-nc-nd", "CC BY-NC-ND"),
        ("CC BY-NC-SA 3.0", "CC BY-NC-SA 3.0"),
        ("CC-BY-NC-4.0", "CC BY-NC 4.0"),
        ("cc by nc sa 3", "CC BY-NC-SA 3.0"),
        ("Licensed under CC BY-SA 4.0.", "CC BY-SA 4.0"),
        ("CC0", "CC0 1.0"),
        ("cc0 1.0", "CC0 1.0"),
        ("CC-0", "CC0 1.0"),
        # sentences
        (
            "This is an open access article distributed under the terms of the Creative Commons "
            "Attribution License",
            "CC BY",
        ),
        (
            "Creative Commons Attribution-NonCommercial-NoDerivatives 4.0 International License",
            "CC BY-NC-ND 4.0",
        ),
        ("Creative Commons Attribution-NonCommercial-ShareAlike 3.0 Unported", "CC BY-NC-SA 3.0"),
        ("the Creative Commons Attribution Non-Commercial License, which permits", "CC BY-NC"),
        (
            "distributed under the Creative Commons Attribution License, which permits use. "
            "Non-commercial reuse is discussed elsewhere.",
            "CC BY",
        ),
        ("Creative Commons CC0 public domain dedication", "CC0 1.0"),
        ("Creative Commons Attribution 4.0 International (CC BY 4.0)", "CC BY 4.0"),
        # the first license named wins: the article's, not the data waiver's
        (BMC_TEXT, "CC BY 4.0"),
    ],
)
def test_normalize_license_recognises_creative_commons(text: str, expected: str) -> None:
    assert normalize_license(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("  Elsevier user license ", "Elsevier user license"),
        (
            "http://www.elsevier.com/open-access/userlicense/1.0/",
            "http://www.elsevier.com/open-access/userlicense/1.0/",
        ),
        ("open access by agreement", "open access by agreement"),
        ("Creative Commons license", "Creative Commons license"),
        ("All rights reserved", "All rights reserved"),
        ("public domain", "public domain"),
    ],
)
def test_normalize_license_keeps_other_text(text: str | None, expected: str | None) -> None:
    assert normalize_license(text) == expected


def test_normalize_license_is_idempotent() -> None:
    for text in ("CC BY 4.0", "CC BY-NC-SA 3.0", "CC0 1.0", "CC BY", "CC BY-ND 2.5", "Custom"):
        assert normalize_license(normalize_license(text)) == normalize_license(text)


@pytest.mark.parametrize(
    ("text", "group"),
    [
        ("CC0", LicenseGroup.COMMERCIAL),
        ("https://creativecommons.org/publicdomain/zero/1.0/", LicenseGroup.COMMERCIAL),
        ("https://creativecommons.org/publicdomain/mark/1.0/", LicenseGroup.COMMERCIAL),
        ("This work is in the public domain", LicenseGroup.COMMERCIAL),
        ("CC BY 4.0", LicenseGroup.COMMERCIAL),
        ("CC-BY", LicenseGroup.COMMERCIAL),
        ("http://creativecommons.org/licenses/by-sa/4.0/", LicenseGroup.COMMERCIAL),
        ("CC BY-ND 4.0", LicenseGroup.COMMERCIAL),
        ("Creative Commons Attribution License", LicenseGroup.COMMERCIAL),
        (BMC_TEXT, LicenseGroup.COMMERCIAL),
        ("CC BY-NC 4.0", LicenseGroup.NONCOMMERCIAL),
        ("cc by-nc-nd", LicenseGroup.NONCOMMERCIAL),
        ("http://creativecommons.org/licenses/by-nc-sa/4.0/", LicenseGroup.NONCOMMERCIAL),
        ("Creative Commons Attribution-NonCommercial 4.0 International License", LicenseGroup.NONCOMMERCIAL),
        (None, LicenseGroup.OTHER),
        ("", LicenseGroup.OTHER),
        ("Elsevier user license", LicenseGroup.OTHER),
        ("All rights reserved", LicenseGroup.OTHER),
        ("Creative Commons license", LicenseGroup.OTHER),
    ],
)
def test_license_group(text: str | None, group: LicenseGroup) -> None:
    assert license_group(text) is group
