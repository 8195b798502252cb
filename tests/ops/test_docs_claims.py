"""Docs that name code are claims about it: the settings the configuration page lists, and
the files, tests, settings and error codes the threat model names, must exist."""

import re
from pathlib import Path

from django.conf import settings

from payments.api.errors import ERROR_CODES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_every_delaypay_setting_is_in_the_configuration_page():
    source = (ROOT / "delaypay" / "settings.py").read_text()
    page = (DOCS / "reference" / "configuration.md").read_text()
    names = set(re.findall(r'"(DELAYPAY_[A-Z0-9_]+)"', source))
    assert names and not sorted(n for n in names if f"`{n}`" not in page)


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
