"""Every failure and review reason the product can record has a sentence for staff
(payments/reasons.py), and nothing else does."""

import ast
from pathlib import Path

from ledger.services import Outcome
from payments.models import FailureReason, ReviewReason
from payments.reasons import FAILURE_REASON_SENTENCES, REVIEW_REASON_SENTENCES, failure_reason, review_reason

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("api", "common", "console", "ledger", "payments", "payouts", "rails", "recurring", "webhooks")


def test_every_failure_and_review_reason_has_a_sentence():
    assert set(FAILURE_REASON_SENTENCES) == set(FailureReason.values)
    assert set(REVIEW_REASON_SENTENCES) == set(ReviewReason.values)
    for sentence in (*FAILURE_REASON_SENTENCES.values(), *REVIEW_REASON_SENTENCES.values()):
        assert sentence and sentence[0].isupper() and not sentence.endswith("."), sentence


def test_the_ledgers_refusals_that_fail_a_payment_are_failure_reasons():
    """A payment the ledger refuses fails with the ledger's outcome as its reason
    (payments/execution.py): each such outcome is a FailureReason, so it has a sentence."""
    refusals = {outcome.value for outcome in Outcome if not outcome.moved}
    assert refusals <= set(FailureReason.values)


def reason_literals() -> set[str]:
    """Every string the product writes as a failure_reason or review_reason keyword or key."""
    found = set()
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.keyword) and node.arg in ("failure_reason", "review_reason"):
                    value = node.value
                elif isinstance(node, ast.Dict):
                    pairs = [v for k, v in zip(node.keys, node.values, strict=True)
                             if isinstance(k, ast.Constant) and k.value in ("failure_reason", "review_reason")]
                    value = pairs[0] if pairs else None
                else:
                    continue
                if isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value:
                    found.add(value.value)
    return found


def test_no_reason_is_written_as_a_literal_outside_the_codes():
    assert reason_literals() <= set(FailureReason.values) | set(ReviewReason.values)


def test_a_reason_reads_as_its_sentence_with_the_code_after_it():
    assert str(failure_reason("declined")).endswith("(declined)")
    assert str(review_reason("outcome_unknown")).startswith("The rail never said")
    assert str(failure_reason("something_new")) == "something_new"  # an unknown code is shown as it is
    assert failure_reason("") == review_reason("") == "-"
