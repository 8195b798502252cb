"""Property-based fuzzing of POST /payments with hypothesis.

Every field gets random JSON (and near-miss values around the valid ones); an
independent oracle says whether the request is valid. The properties: never a 5xx; a
valid request creates exactly one payment, with the jitter and expiry it asked for; an
invalid one is a 400 in the error shape and leaves no payment and no idempotency key
behind. The optional fields (jitter_seconds, expires_after) are sent half the time.
"""

import json
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from hypothesis import HealthCheck, event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from ledger.models import Account
from ledger.services import account_set_status
from payments.models import IdempotencyKey, ScheduledPayment
from tests.api import post
from tests.factories import funded_account
from tests.scale import scaled

pytestmark = pytest.mark.django_db

FIELDS = ("from_account", "to_account", "amount", "execute_at")
OPTIONAL = ("jitter_seconds", "expires_after")
MAX_EXPIRY_SECONDS = 365 * 86400

JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
ANY_JSON = st.recursive(
    JSON_LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def tagged(*, good, bad):
    """``(value, is_valid)``: a valid value three times in four, so whole requests are
    valid often enough to check the success path too."""
    return st.integers(0, 3).flatmap(
        lambda pick: bad.map(lambda v: (v, False)) if pick == 2 else good.map(lambda v: (v, True))
    )


def rarely(label: str, data) -> bool:
    """True about one time in twenty (hypothesis favours 0 and the bounds: avoid them)."""
    return data.draw(st.integers(0, 19), label=label) == 7


def timestamps(low: timedelta, high: timedelta, *, offset=True):
    """RFC 3339 strings for now + [low, high], in a random offset and precision."""

    @st.composite
    def build(draw):
        at = timezone.now() + draw(st.timedeltas(min_value=low, max_value=high))
        tz_minutes = draw(st.sampled_from([0, 0, 330, -480, 840, -720, 59]))
        local = at.astimezone(timezone.get_fixed_timezone(tz_minutes))
        text = local.strftime("%Y-%m-%dT%H:%M:%S")
        digits = draw(st.integers(0, 9))
        if digits:
            text += "." + f"{local.microsecond:06d}{draw(st.integers(0, 999)):03d}"[:digits]
        if not offset:
            return text
        if tz_minutes == 0:
            return text + draw(st.sampled_from(["Z", "z", "+00:00", "-00:00"]))
        return text + local.strftime("%z")[:3] + ":" + local.strftime("%z")[3:]

    return build()


def amounts():
    """Any JSON, near misses around the bounds, and "10.0"-like coercible values; valid
    means what the API promises: a JSON integer in 1..DELAYPAY_MAX_AMOUNT."""
    top = settings.DELAYPAY_MAX_AMOUNT
    candidates = st.one_of(
        st.integers(1, top),
        st.sampled_from([0, 1, top, top + 1, -1, True, False, None]),
        st.integers(),
        st.integers(1, 10**6).map(float),  # 10.0: integral, still not an integer
        st.integers(1, 10**6).map(str),  # "10"
        ANY_JSON,
    )
    return candidates.map(lambda v: (v, type(v) is int and 1 <= v <= top))


def execute_ats():
    return tagged(
        good=timestamps(timedelta(minutes=2), timedelta(days=364)),
        bad=st.one_of(
            timestamps(-timedelta(days=3650), -timedelta(minutes=1)),
            timestamps(timedelta(days=366), timedelta(days=7300)),
            timestamps(timedelta(minutes=2), timedelta(days=364), offset=False),  # naive
            timestamps(timedelta(minutes=2), timedelta(days=364)).map(lambda s: s[:16] + "Z"),  # no seconds
            timestamps(timedelta(minutes=2), timedelta(days=364)).map(lambda s: s.replace("-", "", 2)),  # basic
            ANY_JSON,
        ),
    )


def jitters():
    """Valid: a JSON integer in 0..3600, the bounds included; nothing is coerced."""
    candidates = st.one_of(
        st.integers(0, 3600),
        st.sampled_from([0, 3600, 3601, -1, True, False, None, 60.0, "60"]),
        st.integers(),
        ANY_JSON,
    )
    return candidates.map(lambda v: (v, type(v) is int and 0 <= v <= 3600))


@st.composite
def composed_durations(draw):
    """``(text, seconds)``: an ISO 8601 duration built from weeks, days, hours, minutes
    and seconds, any of them left out; ``seconds`` is what it spans."""
    units = {"W": 604800, "D": 86400, "H": 3600, "M": 60, "S": 1}
    parts = draw(st.fixed_dictionaries({}, optional={u: st.integers(0, 10**6) | st.integers(0, 60) for u in units}))
    date = "".join(f"{parts[u]}{u}" for u in "WD" if u in parts)
    clock = "".join(f"{parts[u]}{u}" for u in "HMS" if u in parts)
    text = "P" + date + (f"T{clock}" if clock else "")
    return text, sum(parts[u] * units[u] for u in parts)


def expiries():
    """Valid: a composed duration with at least one part, spanning 1 s..365 days. Years
    and months (their length varies), fractions, lower case, a dangling T, a sign and
    non-strings are invalid."""
    good_or_out_of_range = composed_durations().map(
        lambda d: (d[0], d[0] != "P" and 1 <= d[1] <= MAX_EXPIRY_SECONDS, d[1])
    )
    invalid = st.one_of(
        st.integers(1, 99).map(lambda n: f"P{n}Y"),
        st.integers(1, 99).map(lambda n: f"P{n}M"),
        st.integers(1, 99).map(lambda n: f"P{n}MT1H"),
        st.integers(1, 99).map(lambda n: f"PT{n}.5S"),
        st.integers(1, 99).map(lambda n: f"pt{n}m"),
        st.integers(1, 99).map(lambda n: f"P{n}DT"),
        st.integers(1, 99).map(lambda n: f"-PT{n}M"),
        st.integers(1, 99).map(lambda n: f" PT{n}M"),
        st.sampled_from(["", "P", "PT", "T1H", "1D", None, 30, True]),
        ANY_JSON.filter(lambda v: not (isinstance(v, str) and v.startswith("P"))),
    ).map(lambda v: (v, False, None))
    return st.one_of(good_or_out_of_range, invalid)


@pytest.fixture
def world(user):
    own, own_second = funded_account(owner=user, balance=10), funded_account(owner=user)
    own_frozen = funded_account(owner=user)
    account_set_status(account_id=own_frozen.id, status=Account.Status.FROZEN)
    target, target_frozen, target_closed = funded_account(), funded_account(), funded_account()
    account_set_status(account_id=target_frozen.id, status=Account.Status.FROZEN)
    account_set_status(account_id=target_closed.id, status=Account.Status.CLOSED)
    stranger = funded_account(balance=10)
    froms = tagged(
        good=st.just(own.id),
        bad=st.sampled_from([own_frozen.id, stranger.id, target.id, "acc_00000000000000000000000000"]) | ANY_JSON,
    )
    tos = tagged(
        good=st.sampled_from([target.id, target_frozen.id, own_second.id, stranger.id]),
        bad=st.sampled_from([own.id, target_closed.id, "acc_00000000000000000000000000", ""]) | ANY_JSON,
    )
    return {
        "from_account": froms,
        "to_account": tos,
        "amount": amounts(),
        "execute_at": execute_ats(),
        "jitter_seconds": jitters(),
        "expires_after": expiries().map(lambda d: (d[0], d[1])),
    }


@hypothesis_settings(
    max_examples=scaled(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_post_payments_never_fails_and_never_half_creates(api, world, data):
    body, ok = {}, True
    for field in FIELDS:
        if rarely(f"omit {field}", data):
            ok = False
            continue
        value, field_ok = data.draw(world[field], label=field)
        body[field] = value
        ok = ok and field_ok
    for field in OPTIONAL:
        if data.draw(st.booleans(), label=f"send {field}"):
            value, field_ok = data.draw(world[field], label=field)
            body[field] = value
            ok = ok and field_ok
    if rarely("extra field", data):
        body["x" + data.draw(st.text(max_size=10), label="extra")] = data.draw(ANY_JSON)
        ok = False
    if rarely("not an object", data):
        body, ok = data.draw(JSON_LEAF | st.lists(ANY_JSON, max_size=3), label="body"), False

    key = str(uuid.uuid4())
    before = ScheduledPayment.objects.count()
    response = post(api, "/api/v1/payments", json.dumps(body), key=key)

    event(f"{response.status_code} {'valid' if ok else 'invalid'}")
    assert response.status_code < 500, response.content
    created = ScheduledPayment.objects.count() - before
    if ok:
        assert response.status_code == 201, (body, response.content)
        assert created == 1
        payment = response.json()
        assert (payment["from_account"], payment["to_account"], payment["amount"]) == (
            body["from_account"], body["to_account"], body["amount"]
        )
        assert IdempotencyKey.objects.filter(key=key).exists()
        stored = ScheduledPayment.objects.get(pk=payment["payment_id"])
        jitter = body.get("jitter_seconds", 0)
        assert payment["jitter_seconds"] == stored.jitter_seconds == jitter
        assert stored.requested_execute_at <= stored.execute_at <= stored.requested_execute_at + timedelta(
            seconds=jitter
        )
        if "expires_after" in body:
            assert stored.expires_after == timedelta(seconds=spans(body["expires_after"]))
        else:
            assert stored.expires_after is None and payment["expires_after"] is None
    else:
        assert response.status_code == 400, (body, response.content)
        assert response.json()["code"] in ("validation_error", "parse_error")
        assert created == 0
        assert not IdempotencyKey.objects.filter(key=key).exists()


def spans(text: str) -> int:
    """Seconds a composed duration spans (the oracle's own reading, not the API's parser)."""
    units = {"W": 604800, "D": 86400, "H": 3600, "M": 60, "S": 1}
    date, _, clock = text[1:].partition("T")
    total = 0
    for part, allowed in ((date, "WD"), (clock, "HMS")):
        number = ""
        for char in part:
            if char.isdigit():
                number += char
            else:
                assert char in allowed
                total += int(number) * units[char]
                number = ""
    return total
