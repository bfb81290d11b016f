"""Every learner-facing message exists in both languages with the same placeholders."""

from __future__ import annotations

import string

import pytest

from ddp_lab.course import i18n


def _fields(text: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(text) if f}


@pytest.mark.parametrize("key", sorted(i18n.MESSAGES))
def test_message_has_both_languages_with_same_fields(key):
    entry = i18n.MESSAGES[key]
    assert set(entry) == set(i18n.LANGUAGES)
    assert _fields(entry["en"]) == _fields(entry["zh"])


def test_switch_language():
    try:
        i18n.set_language("zh")
        assert i18n.t("your_code_here") == "在这里写你的代码"
        i18n.set_language("en")
        assert i18n.t("your_code_here") == "your code here"
        with pytest.raises(ValueError):
            i18n.set_language("fr")
    finally:
        i18n.set_language("en")
