"""Staff forms for the payments console: the review queue's confirmation pages."""

from django import forms

from common.text import validate_display_text
from payments.services import MAX_REVIEW_REASON


class ReviewForm(forms.Form):
    """Why a staff member resolves a payment in review: the reason goes into the
    payment's audit trail (its event) with their user."""

    reason = forms.CharField(
        max_length=MAX_REVIEW_REASON,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        validators=[validate_display_text],
        help_text="Required, on one line. Recorded in each payment's event history with your user.",
    )


class RedriveForm(ReviewForm):
    execute_at = forms.DateTimeField(
        required=False,
        label="Run at",
        help_text="Optional, UTC (e.g. 2030-01-01 12:00:00) or with an offset; empty: at once.",
    )
