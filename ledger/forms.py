"""Staff forms for the ledger console."""

from django import forms
from django.conf import settings

from common.admin_tools import MAX_REASON_LENGTH
from common.text import validate_display_text


class DepositForm(forms.Form):
    """A staff deposit into one account: an amount and why.

    The form itself carries no key: the page's URL carries a one-time token issued when
    the form was opened (``deposit_form_open``) and consumed by its submit in the
    deposit's transaction (``deposit_form_submit``); see docs/reference/admin-console.md,
    "Deposits: once per opened form"."""

    reason = forms.CharField(
        max_length=MAX_REASON_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        validators=[validate_display_text],
        help_text="Required, on one line. Recorded with your user in the account's staff actions.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The limit is a setting, so the field is built per form, not at import.
        self.fields = {
            "amount": forms.IntegerField(
                min_value=1,
                max_value=settings.DELAYPAY_MAX_AMOUNT,
                help_text="Whole units, credited from the issuance account.",
            ),
            **self.fields,
        }
