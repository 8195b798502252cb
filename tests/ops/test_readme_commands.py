"""A command the README shows works as written in a fresh shell: no virtualenv activated and
no variable exported. So a manage.py line names the venv's Python and sets DJANGO_DEBUG=1
(without it the settings are production's and refuse to start without DJANGO_SECRET_KEY);
the default DATABASE_URL is make run's database."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRESH_SHELL = re.compile(r"^DJANGO_DEBUG=1 \.venv/bin/python manage\.py \w+")


def manage_py_lines(text: str) -> list[str]:
    """Each `manage.py` command of the text: inline code spans and lines of code blocks."""
    spans = re.findall(r"`([^`\n]*manage\.py[^`\n]*)`", text)
    blocks = [line.strip() for block in re.findall(r"```\w*\n(.*?)```", text, re.S) for line in block.splitlines()]
    return spans + [line for line in blocks if "manage.py" in line]


def test_readme_manage_py_lines_run_in_a_fresh_shell():
    lines = manage_py_lines((ROOT / "README.md").read_text())
    assert lines, "the README shows reconcile"
    assert not [line for line in lines if not FRESH_SHELL.match(line)]


def test_the_check_refuses_a_line_that_needs_an_activated_venv():
    assert manage_py_lines("run `python manage.py reconcile` now") == ["python manage.py reconcile"]
    assert not FRESH_SHELL.match("python manage.py reconcile")
    assert not FRESH_SHELL.match(".venv/bin/python manage.py reconcile")
