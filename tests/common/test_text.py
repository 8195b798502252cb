"""The display-text rule (common/text.py): no control, format (bidirectional and
zero-width), private-use, surrogate or separator characters in a name, description or
reason, in the API (tests/payments/api/test_display_text.py) and in the admin's forms."""

import sys
import unicodedata

import pytest
from django.core.exceptions import ValidationError

from common.admin_tools import ReasonForm
from common.text import REFUSED_CATEGORIES, refused_character, validate_display_text
from console.forms import RedriveForm, ReviewForm
from ledger.forms import DepositForm

# One of each kind the rule refuses, and the two the issue found stored in names.
REFUSED = {
    "bell": "\u0007",
    "escape": "\u001b",
    "tab": "\t",
    "line feed": "\n",
    "carriage return": "\r",
    "delete": "\u007f",
    "next line (C1)": "\u0085",
    "right-to-left override": "\u202e",
    "left-to-right isolate": "\u2066",
    "arabic letter mark": "\u061c",
    "zero-width space": "\u200b",
    "zero-width joiner": "\u200d",
    "soft hyphen": "\u00ad",
    "byte order mark": "\ufeff",
    "tag latin small a": "\U000e0061",
    "private use": "\ue000",
    "supplementary private use": "\U000f0000",
    "surrogate": "\ud800",
    "line separator": "\u2028",
    "paragraph separator": "\u2029",
}
ACCEPTED = [
    "Alice's savings",
    "Zoë & Søren — café № 5",
    "東京の口座",
    "مرحبا بالعالم",  # right-to-left letters are text, not controls
    "שלום",
    "rent 🙂",
    "no\u00a0break",  # a no-break space is a space (Zs)
    "",
]


@pytest.mark.parametrize("character", REFUSED.values(), ids=REFUSED.keys())
def test_a_refused_character_anywhere_is_a_validation_error_naming_its_code_point(character):
    for value in (f"Bob{character}dcba", character, f"{character}x", f"x{character}"):
        with pytest.raises(ValidationError) as err:
            validate_display_text(value)
        (message,) = err.value.messages
        assert f"U+{ord(character):04X}" in message
        assert character not in message  # named, never echoed
        assert err.value.code == "display_text"


@pytest.mark.parametrize("value", ACCEPTED)
def test_letters_of_every_script_spaces_and_emoji_are_accepted(value):
    validate_display_text(value)


def test_every_character_of_a_refused_category_is_refused_and_no_other():
    for code in range(sys.maxunicode + 1):
        character = chr(code)
        assert (refused_character(character) is not None) == (unicodedata.category(character) in REFUSED_CATEGORIES)


@pytest.mark.parametrize(
    "form",
    [
        lambda reason: ReasonForm({"reason": reason}),
        lambda reason: ReviewForm({"reason": reason}),
        lambda reason: RedriveForm({"reason": reason}),
        lambda reason: DepositForm({"reason": reason, "amount": 10}),
    ],
    ids=["ReasonForm", "ReviewForm", "RedriveForm", "DepositForm"],
)
@pytest.mark.parametrize("character", ["\u0007", "\u202e", "\u200b", "\n"], ids=["bell", "rlo", "zwsp", "newline"])
def test_the_admin_forms_refuse_them_in_the_reason(form, character):
    assert form("checked with the payee").is_valid()
    refused = form(f"checked{character}with the payee")
    assert not refused.is_valid()
    assert list(refused.errors) == ["reason"]
    assert f"U+{ord(character):04X}" in refused.errors["reason"][0]
