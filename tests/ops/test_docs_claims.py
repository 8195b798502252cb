"""Docs that name code are claims about it, kept true here: every setting is in the
configuration page; every Procfile process is in the production guide; every alert rule has
a row in the operations reference and a runbook section; every metric the code exports is
in the operations reference; every test file the docs name exists; and the files, tests,
settings and error codes the threat model names exist; and the other way round, every
setting and metric the docs name exists. (Broken links and anchors fail
`make docs`: mkdocs.yml's validation, strict.)"""

import re
from pathlib import Path

from django.conf import settings

from api.errors import ERROR_CODES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PRODUCT_PACKAGES = ("api", "console", "payouts", "recurring", "payments", "ledger", "webhooks", "delaypay", "common",
                    "rails")


def test_every_delaypay_setting_is_in_the_configuration_page():
    source = (ROOT / "delaypay" / "settings.py").read_text()
    page = (DOCS / "reference" / "configuration.md").read_text()
    names = set(re.findall(r'"(DELAYPAY_[A-Z0-9_]+)"', source))
    assert names and not sorted(n for n in names if f"`{n}`" not in page)


def procfile_processes() -> list[str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return [line.split(":", 1)[0] for line in lines if line and not line.startswith("#")]


def test_every_procfile_process_is_in_the_production_guide():
    """A deployment that follows the guide runs every process (it once left out webhooks and
    payouts: no webhook, no payout, ever)."""
    guide = (DOCS / "how-to" / "run-in-production.md").read_text()
    processes = procfile_processes()
    assert {"web", "worker", "promoter", "beat", "webhooks", "payouts"} <= set(processes)
    assert not [p for p in processes if f"`{p}`" not in guide]


def alert_names() -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)", (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text(), re.M)


def test_every_alert_has_a_row_and_a_runbook_section():
    operations = (DOCS / "reference" / "operations.md").read_text()
    runbook = (DOCS / "how-to" / "respond-to-alerts.md").read_text()
    alerts = alert_names()
    assert len(alerts) > 10
    assert not [a for a in alerts if not re.search(rf"^\| `{a}` \|", operations, re.M)], "rows in operations.md"
    # A section of the runbook, or an alert whose annotation sends the reader to another how-to.
    missing = [a for a in alerts if not re.search(rf"^## {a} \(", runbook, re.M)]
    assert not missing, f"sections in respond-to-alerts.md: {missing}"


# Where the code names a metric: prometheus_client's instruments, and the families the
# scrape-time collectors build.
METRIC = re.compile(
    r"(?:Counter|Gauge|Histogram|Summary|GaugeMetricFamily|CounterMetricFamily)\(\s*\"(delaypay_[a-z0-9_]+)\""
)


def test_every_exported_metric_is_in_the_operations_reference():
    operations = (DOCS / "reference" / "operations.md").read_text()
    names = exported_metrics()
    assert len(names) > 20
    assert not sorted(n for n in names if f"`{n}" not in operations)


def exported_metrics() -> set[str]:
    """Every metric family the code names (METRIC, in the product's packages)."""
    names = set()
    for package in PRODUCT_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            names |= set(METRIC.findall(path.read_text()))
    return names


def test_every_setting_and_metric_the_docs_name_exists():
    """The other way round: a `DELAYPAY_*` name anywhere in the docs is an environment
    variable the code, the Procfile, the Makefile or the tests read; a `delaypay_*` metric the docs
    name (its `_total`, `_bucket`, `_count`, `_sum` series too) is one the code exports.
    Prefixes (`DELAYPAY_RAIL_BREAKER_`) and the scratch databases' names are not claims."""
    texts = [(ROOT / "README.md").read_text(), (ROOT / "CHANGELOG.md").read_text(),
             *(p.read_text() for p in DOCS.rglob("*.md"))]
    sources = [p for package in (*PRODUCT_PACKAGES, "devtools", "tests") for p in (ROOT / package).rglob("*.py")]
    readers = "\n".join([(ROOT / "Procfile").read_text(), (ROOT / "Makefile").read_text(),
                         *(p.read_text() for p in sources)])
    named = {n for text in texts for n in re.findall(r"\bDELAYPAY_[A-Z0-9_]*[A-Z0-9]\b", text)}
    assert len(named) > 50
    assert not sorted(n for n in named if not re.search(rf"\b{n}\b", readers))
    metrics = exported_metrics()
    quoted = {m for text in texts for m in re.findall(r"`(delaypay_[a-z0-9_]*[a-z0-9])\b", text)}
    databases = {"delaypay_chaos"}
    assert len(quoted) > 30
    family = {m: re.sub(r"_(total|bucket|count|sum)$", "", m) for m in quoted - databases}
    assert not sorted(m for m, f in family.items() if m not in metrics and f not in metrics)


def test_every_test_file_the_docs_name_exists():
    texts = [(ROOT / "README.md").read_text(), *(p.read_text() for p in DOCS.rglob("*.md"))]
    named = {m for text in texts for m in re.findall(r"tests/[\w/]+\.py", text)}
    assert named and not sorted(n for n in named if not (ROOT / n).exists())


def test_the_threat_model_names_only_what_exists():
    page = (DOCS / "explanation" / "threat-model.md").read_text()
    quoted = re.findall(r"`([^`]+)`", page)
    paths = [q for q in quoted if re.fullmatch(r"[\w./-]+\.py|[\w-]+/migrations/\d{4}", q)]
    assert "ledger/services.py" in paths
    for path in paths:
        found = (ROOT / path).exists() or list(ROOT.glob(f"{path}_*.py"))
        assert found, f"threat-model.md names {path}, which does not exist"
    for name in (q for q in quoted if q.startswith("DELAYPAY_")):
        assert hasattr(settings, name), name
    for code in ("self_approval_forbidden", "conflict_of_interest"):
        assert f"`{code}`" in page and code in ERROR_CODES
    for command in re.findall(r"manage\.py (\w+)", page):
        assert list(ROOT.glob(f"*/management/commands/{command}.py")), command


def test_every_task_and_beat_entry_the_docs_name_exists():
    """A task (`payments.tasks.X`) or a beat entry (`purge-idempotency-keys` entry) in the
    docs is one the code has; and the housekeeping the docs promise needs no cron: every
    purge in the beat schedule is in the operations reference."""
    from delaypay.celery import app

    app.loader.import_default_modules()
    text = "\n".join(page.read_text() for page in DOCS.rglob("*.md"))
    tasks = set(re.findall(r"`((?:payments|webhooks)\.tasks\.\w+)`", text))
    entries = set(re.findall(r"`([a-z]+(?:-[a-z]+)+)` entry", text))
    assert tasks and entries
    assert not sorted(tasks - set(app.tasks)), "tasks the docs name that do not exist"
    assert not sorted(entries - set(settings.CELERY_BEAT_SCHEDULE)), "beat entries the docs name that do not exist"
    operations = (DOCS / "reference" / "operations.md").read_text()
    purges = [name for name in settings.CELERY_BEAT_SCHEDULE if name.startswith("purge-")]
    assert purges and not [name for name in purges if f"`{name}` entry" not in operations]


def test_every_make_target_and_manage_command_the_docs_name_exists():
    """`make X` and `manage.py X` written anywhere in the docs, the reference pages too (the
    README, the tutorial and the how-to guides also have their shell blocks checked in full:
    tests/ops/test_docs_commands.py)."""
    from django.core.management import get_commands

    from tests.ops.test_docs_commands import make_targets

    targets, commands = set(make_targets()), set(get_commands())
    named, wrong = set(), []
    for page in [ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS.rglob("*.md")]:
        text = page.read_text()
        for target in re.findall(r"`make ([a-z][a-z0-9-]*)", text):
            named.add(f"make {target}")
            if target not in targets:
                wrong.append(f"{page.name}: make {target}")
        for command in re.findall(r"`[^`\n]*manage\.py ([a-z_]+)", text):
            named.add(f"manage.py {command}")
            if command not in commands:
                wrong.append(f"{page.name}: manage.py {command}")
    assert {"make chaos-ha", "make test-ha", "manage.py failover", "manage.py reconcile"} <= named
    assert wrong == []
