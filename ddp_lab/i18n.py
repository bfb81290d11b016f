"""Learner-facing messages: the language switch and the gettext lookup.

The English text is the message id, written where the message is used; the Chinese texts
live in the gettext catalog ``ddp_lab/locale/zh/LC_MESSAGES/ddp_lab.po`` (compiled to
``ddp_lab.mo``), managed with Babel (docs/AUTHORING.md, "Messages"):

    raise TypeError(_t("ring_all_reduce needs a torch.Tensor, got {kind}.", kind=name))

``_t`` looks the text up in the current language (or the one passed after it) and formats it
with ``str.format``. ``_tp`` takes a msgctxt first, for one English text that needs two
Chinese ones; ``pair`` gives both languages, for objects that keep both (a doctor finding);
``N_`` marks a text for extraction where the lookup happens later (``lookup(texts, key)``
for a key computed at run time). Lookups use the standard
library's ``gettext`` only. Identifiers, docstrings and comments stay in English.

The language comes from ``set_language`` or, at import, from the ``DDP_LAB_LANG``
environment variable ("en" or "zh"). This module imports nothing from ddp_lab: teaching
code, the runtime and the course machinery all stand on it.
"""

from __future__ import annotations

import functools
import gettext
import os
from pathlib import Path

LANGUAGES = ("en", "zh")
DOMAIN = "ddp_lab"
LOCALE_DIR = Path(__file__).parent / "locale"

_language = os.environ.get("DDP_LAB_LANG", "en").lower()[:2]
if _language not in LANGUAGES:
    _language = "en"


@functools.cache
def translations(lang: str) -> gettext.NullTranslations:
    """The catalog of ``lang`` (English: none, the message ids are English)."""
    if lang == "en":
        return gettext.NullTranslations()
    return gettext.translation(DOMAIN, LOCALE_DIR, languages=[lang])


def _t(message: str, lang: str | None = None, /, **fields: object) -> str:
    """``message`` in ``lang`` (default: the current language), formatted with ``fields``."""
    return translations(lang or _language).gettext(message).format(**fields)


def _tp(context: str, message: str, lang: str | None = None, /, **fields: object) -> str:
    """``_t`` for a message that has a msgctxt."""
    return translations(lang or _language).pgettext(context, message).format(**fields)


def pair(message: str, /, **fields: object) -> tuple[str, str]:
    """``message`` formatted in both languages, ``(en, zh)``."""
    return _t(message, "en", **fields), _t(message, "zh", **fields)


def pair_p(context: str, message: str, /, **fields: object) -> tuple[str, str]:
    """``pair`` for a message that has a msgctxt."""
    return _tp(context, message, "en", **fields), _tp(context, message, "zh", **fields)


def lookup(texts: dict[str, str], key: str, lang: str | None = None, /, **fields: object) -> str:
    """``_t(texts[key], ...)``: for a key computed at run time (``texts`` holds ``N_`` texts)."""
    return _t(texts[key], lang, **fields)


def lookup_pair(texts: dict[str, str], key: str, /, **fields: object) -> tuple[str, str]:
    """``pair(texts[key], ...)``: ``lookup`` in both languages."""
    return pair(texts[key], **fields)


def N_(message: str) -> str:  # noqa: N802 (the gettext convention)
    """Mark ``message`` for extraction; translate it later with ``_t(message)``."""
    return message


def set_language(lang: str) -> None:
    """Select the language of learner-facing messages: "en" or "zh"."""
    global _language
    lang = str(lang).lower()[:2]
    if lang not in LANGUAGES:
        # Both languages: the learner may not read the one that is set.
        raise ValueError(
            "\n".join(
                _t(
                    "language must be one of {choices}, got {value!r}.",
                    x,
                    choices=LANGUAGES,
                    value=lang,
                )
                for x in LANGUAGES
            )
        )
    _language = lang


def get_language() -> str:
    """Return the current language code."""
    return _language


# How Babel finds the messages (``pybabel extract`` flags, tests/test_i18n.py): the helpers
# above and where their msgctxt / msgid are.
BABEL_KEYWORDS: dict[str, tuple | None] = {
    "_t": None,
    "_tp": ((1, "c"), 2),
    "pair": None,
    "pair_p": ((1, "c"), 2),
    "N_": None,
}
