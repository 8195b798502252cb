"""One list of rails (rails/base.py's RAIL_NAMES): the payee models' choices, the
database's CHECK, the metrics' labels and the registry's builders all agree with it."""

import pytest
from django.db import connection

from payments import metrics
from payments.models import Rail
from rails.base import RAIL_NAMES
from rails.registry import close_rails, get_rail


def test_the_models_choices_are_the_rail_names():
    assert tuple(Rail.values) == RAIL_NAMES
    assert Rail.SANDBOX == "sandbox"  # a name of the list is a member, as the code spells it


@pytest.mark.django_db
def test_the_databases_check_lists_exactly_the_rail_names():
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'payments_payee_rail_valid'"
        )
        (definition,) = cur.fetchone()
    named = {name for name in RAIL_NAMES if f"'{name}'" in definition}
    assert named == set(RAIL_NAMES), definition
    assert definition.count("'") == 2 * len(RAIL_NAMES), f"the CHECK names another rail: {definition}"


def test_every_rail_has_its_metric_series_from_the_start():
    labelled = {labels["rail"] for labels in _label_sets(metrics.rail_calls_total)}
    assert labelled == set(RAIL_NAMES)


def test_the_registry_builds_every_named_rail_and_refuses_another(settings):
    try:
        for name in RAIL_NAMES:
            assert get_rail(name).name == name
        with pytest.raises(ValueError, match="unknown rail"):
            get_rail("nope")
    finally:
        close_rails()


def _label_sets(counter) -> list[dict]:
    return [sample.labels for family in counter.collect() for sample in family.samples if "rail" in sample.labels]
