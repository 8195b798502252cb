"""What a recurring create costs the web process at the edges of the rules (issue 14).

Run against a scratch database (it creates two users, two accounts and a few series)::

    DJANGO_DEBUG=1 DJANGO_ALLOWED_HOSTS=testserver DELAYPAY_LOG_LEVEL=ERROR \\
      DATABASE_URL=postgres://root@127.0.0.1:5432/scratch python manage.py shell < devtools/recurring_cost.py

Prints, for each case, the median of five requests through the API and the answer.
"""

import json
import time

from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from common.ids import new_id
from ledger.services import account_create

User = get_user_model()
payer, _ = User.objects.get_or_create(username="cost-payer")
payee, _ = User.objects.get_or_create(username="cost-payee")
source = account_create(owner=payer, name="source")
target = account_create(owner=payee, name="target")
client = APIClient()
client.force_authenticate(payer)
BASE = {"from_account": source.id, "to_account": target.id, "amount": 1, "start_at": "2027-01-01T00:00:00Z"}
CASES = [
    ("count 10000, cron 0 0 29 2 1", {"cron": "0 0 29 2 1", "count": 10000}),
    ("count 1000, cron 0 0 29 2 1", {"cron": "0 0 29 2 1", "count": 1000}),
    ("count 1000, cron 0 0 * * *", {"cron": "0 0 * * *", "count": 1000}),
    ("start 0001-01-01 with a count", {"interval": "P1D", "count": 5, "start_at": "0001-01-01T00:00:00Z"}),
    (
        "start 9999-12-31T23:00Z, cron in Pacific/Kiritimati",
        {"cron": "0 0 * * *", "timezone": "Pacific/Kiritimati", "start_at": "9999-12-31T23:00:00Z"},
    ),
]


def post(body: dict) -> tuple[int, float, str]:
    started = time.perf_counter()
    response = client.post("/api/v1/recurring-payments", body, format="json", HTTP_IDEMPOTENCY_KEY=new_id("key"))
    return response.status_code, (time.perf_counter() - started) * 1000, json.dumps(response.json())[:120]


for name, extra in CASES:
    runs = [post({**BASE, **extra}) for _ in range(5)]
    median = sorted(ms for _, ms, _ in runs)[2]
    print(f"{name}: median {median:.1f} ms, {runs[0][0]} {runs[0][2]}")
