"""Text a person gives for other people to read: account and payee names, webhook
endpoint descriptions and URLs, the reasons staff give. One rule, used by the API's
serializers and the admin's forms alike.

Such text is shown in the admin console, in lists, in exports and in webhook payloads.
Characters that are invisible or that change how the text around them is laid out would
let it lie about itself: a right-to-left override (U+202E) between "Bob" and "dcba"
shows "Bobabcd"; a zero-width space makes two names that look the same differ; a bell or an
escape sequence acts on a terminal that prints it. So these Unicode general categories
are refused, with no exception (not even tab or newline):

* Cc, control characters (U+0000-U+001F, U+007F-U+009F);
* Cf, format characters: the bidirectional controls, zero-width space, joiner and
  non-joiner, soft hyphen, byte order mark, tag characters;
* Co, private use; Cs, surrogates (never a valid character on their own);
* Zl and Zp, the line and paragraph separators (U+2028, U+2029).

A consequence: emoji joined by a zero-width joiner (family or profession sequences) and
flags of subdivisions (tag characters) are refused; single emoji are accepted.
"""

import unicodedata

from django.core.exceptions import ValidationError

REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Zl", "Zp"})

_KINDS = {
    "Cc": "a control character",
    "Cf": "a format character (bidirectional or zero-width)",
    "Co": "a private-use character",
    "Cs": "a surrogate",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}


# unicodedata has no names for control characters: the ones a person types by accident.
_CONTROL_NAMES = {"\t": "CHARACTER TABULATION (a tab)", "\n": "LINE FEED (a line break)",
                  "\r": "CARRIAGE RETURN (a line break)"}


def refused_character(value: str) -> str | None:
    """The first character of ``value`` that display text may not hold, or None."""
    for character in value:
        if unicodedata.category(character) in REFUSED_CATEGORIES:
            return character
    return None


def validate_display_text(value: str) -> None:
    """Raise ValidationError (code ``display_text``) if ``value`` holds a character of a
    refused category. The message names the character by code point, never echoes it."""
    if not isinstance(value, str):
        return
    character = refused_character(value)
    if character is None:
        return
    category = unicodedata.category(character)
    name = _CONTROL_NAMES.get(character) or unicodedata.name(character, "")
    raise ValidationError(
        "Contains U+%(code)04X%(name)s, %(kind)s: control, format (bidirectional and zero-width), private-use, "
        "surrogate, line and paragraph separator characters are not allowed.",
        code="display_text",
        params={"code": ord(character), "name": f" {name}" if name else "", "kind": _KINDS[category]},
    )
