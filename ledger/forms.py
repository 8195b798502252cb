"""Staff forms for the ledger console."""

from django import forms
from django.conf import settings
from django.core import signing

from common.ids import new_id

DEPOSIT_TOKEN_SALT = "ledger.admin.deposit"
DEPOSIT_TOKEN_MAX_AGE = 24 * 3600


def deposit_token(*, account_id: str) -> str:
    """A signed one-time ledger key for one rendering of the deposit form."""
    return signing.dumps({"account": account_id, "key": new_id("adep")}, salt=DEPOSIT_TOKEN_SALT)


class DepositForm(forms.Form):
    """A staff deposit into one account.

    The hidden ``token`` carries the ledger transfer key, generated when the form is
    rendered and signed, so submitting the same form twice (a double click, a resend
    after the back button) posts the same key and the ledger applies it once. The
    signature binds the key to the account and keeps staff from choosing a key (a
    payment's id, say, which would pass the executor's guard without moving money).
    """

    amount = forms.IntegerField(min_value=1, help_text="Whole units, credited from the issuance account.")
    token = forms.CharField(widget=forms.HiddenInput)

    def __init__(self, *args, account_id: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.account_id = account_id
        # The limit is a setting, so the field is built per form, not at import.
        self.fields["amount"] = forms.IntegerField(
            min_value=1, max_value=settings.DELAYPAY_MAX_AMOUNT, help_text=self.fields["amount"].help_text
        )
        if not self.is_bound:
            self.initial["token"] = deposit_token(account_id=account_id)

    def clean_token(self) -> str:
        """The ledger key the token carries."""
        try:
            data = signing.loads(self.cleaned_data["token"], salt=DEPOSIT_TOKEN_SALT, max_age=DEPOSIT_TOKEN_MAX_AGE)
        except signing.SignatureExpired:
            raise forms.ValidationError("This form expired; reload the page and enter the deposit again.") from None
        except signing.BadSignature:
            raise forms.ValidationError("This form was tampered with; reload the page.") from None
        if data.get("account") != self.account_id:
            raise forms.ValidationError("This form belongs to another account; reload the page.")
        return data["key"]
