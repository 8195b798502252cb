"""The shell commands in the README, the tutorial and the how-to guides run as written.

Every command in a fenced ``sh``, ``bash``, ``shell`` or ``console`` block (in a ``console``
block, or wherever a line starts with a ``$ `` prompt, only the prompted lines) is split into
simple commands (pipes, ``&&``, ``;``, ``$(...)`` and shell functions taken apart, backslash
continuations and multi-line quotes joined, leading ``NAME=value`` assignments stripped,
``<placeholder>`` and ``$VARIABLE`` replaced by a dummy ``1``) and each is checked without
running anything that acts:

* ``python manage.py CMD ARGS`` (any ``python``, ``.venv/bin/python`` included): the command
  exists and its parser accepts the arguments;
* ``python -m MODULE``: the module exists and ``python -m MODULE --help`` exits 0;
* ``make TARGET [VAR=...]``: the target is in the Makefile; ``BENCH_ARGS``/``CHAOS_ARGS``-style
  variables that a target hands to ``manage.py`` are parsed by that command's parser;
* ``celery -A APP SUB --opt``: the app imports, the sub-command exists, it has each option;
* ``honcho start PROCESS``: each process is a line of the Procfile;
* ``gunicorn MODULE ...``: the module exists and gunicorn's own parser accepts the arguments;
* a program in ``NOT_CHECKED``: not checked, for the reason given there;
* anything else fails, so a new kind of command in the docs is added here consciously.
"""

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class
from django.core.management.base import CommandError

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs" / "tutorial").glob("*.md")),
    *sorted((ROOT / "docs" / "how-to").glob("*.md")),
]
# Pages a reader follows on a fresh machine, in a fresh shell in the repository: every
# command there is a development one (see check_fresh_shell). The how-to guides also speak
# of deployed hosts, whose environment the production guide sets.
FRESH_SHELL = {ROOT / "README.md", *(ROOT / "docs" / "tutorial").glob("*.md")}
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}

# Programs whose commands are not checked, and why.
NOT_CHECKED = {
    "curl": "talks to a running server; the API it calls is the schema's, tested in tests/payments/api/",
    "jq": "filters JSON a previous command printed; nothing of the project",
    "psql": "talks to a PostgreSQL server; the SQL in the docs is the operator's",
    "redis-cli": "talks to a Redis server",
    "pg_dropcluster": "Debian's PostgreSQL cluster tool, on a cluster a chaos run printed",
    "sudo": "runs a system tool as another user (PostgreSQL's createuser, apt-get): the machine's set-up, not ours",
    "git": "version control, nothing of the project's own",
    "cd": "a shell built-in",
    "export": "a shell built-in: sets environment variables",
    "pip": "installs packages from requirements files (make install does it)",
    "sleep": "waits",
    "tee": "copies output to a file",
    "cat": "prints a file",
    "date": "prints a time for a request body",
    "head": "reads bytes (a secret key from /dev/urandom)",
    "base64": "encodes bytes",
    "whoami": "prints the user name",
    "grep": "filters output",
    "xdg-open": "opens a page in the desktop's browser",
}
PYTHONS = {"python", "python3", "python3.11", ".venv/bin/python", "./.venv/bin/python"}
HONCHOS = {"honcho", ".venv/bin/honcho"}
CELERYS = {"celery", ".venv/bin/celery"}
GUNICORNS = {"gunicorn", ".venv/bin/gunicorn"}
MAKE_VARIABLE = re.compile(r"\$\(([A-Z_]+)\)")
SEPARATORS = {"|", "||", "&&", ";", "&", "(", ")"}
REDIRECTIONS = {">", ">>", "<", ">&", "&>", "<<"}
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
FUNCTION = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*\(\)\s*\{(.*)\}\s*;?\s*$", re.S)
PLACEHOLDER = re.compile(r"<[A-Za-z_][^<>\n]{0,80}>")
VARIABLE = re.compile(r"\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?])")
DUMMY = "1"


# --- Extraction ------------------------------------------------------------------------


def shell_blocks(markdown: str) -> list[tuple[int, list[str]]]:
    """(line number, command lines) of each block: prompted lines only where there are prompts."""
    blocks, lines, index = [], markdown.splitlines(), 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        fence, language, start = match.group(1), match.group(2).lower(), index + 1
        end = start
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = lines[start:end]
        prompted = [i for i, line in enumerate(body) if line.lstrip().startswith("$ ")]
        if prompted or language == "console":
            commands = []
            for i in prompted:
                commands.append(body[i].lstrip()[2:])
                while commands[-1].endswith("\\") and i + 1 < len(body):
                    i += 1
                    commands[-1] = commands[-1] + "\n" + body[i]
            blocks.append((start, commands))
        elif language in SHELL_LANGUAGES:
            blocks.append((start, body))
        index = end + 1
    return blocks


def substitutions(line: str) -> tuple[str, list[str]]:
    """The line with each ``$(...)`` replaced by a dummy word, and the commands they held."""
    out, inner, index = [], [], 0
    while index < len(line):
        if line.startswith("$(", index) and not line.startswith("$((", index):
            depth, cursor, quote = 1, index + 2, None
            while cursor < len(line) and depth:
                char = line[cursor]
                if quote:
                    quote = None if char == quote else quote
                elif char in "'\"":
                    quote = char
                elif char == "(":
                    depth += 1
                elif char == ")":
                    depth -= 1
                cursor += 1
            inner.append(line[index + 2 : cursor - 1])
            out.append(DUMMY)
            index = cursor
        else:
            out.append(line[index])
            index += 1
    return "".join(out), inner


def complete(text: str) -> bool:
    try:
        shlex.split(substitutions(text)[0], comments=True)
    except ValueError:
        return False
    return not text.endswith("\\")


def logical_lines(lines: list[str]) -> list[str]:
    """Backslash continuations and lines inside an open quote joined into one command line."""
    out, buffer = [], ""
    for line in lines:
        buffer = f"{buffer}\n{line}" if buffer else line
        if complete(buffer):
            out.append(buffer.replace("\\\n", " "))
            buffer = ""
    if buffer:
        out.append(buffer)
    return out


def simple_commands(line: str, functions: set[str]) -> list[list[str]]:
    """The simple commands of one command line (those of its ``$(...)`` included), as words."""
    function = FUNCTION.match(line)
    if function:
        functions.add(function.group(1))
        line = function.group(2)
    line, inner = substitutions(line)
    commands = [command for text in inner for command in simple_commands(text, functions)]
    line = VARIABLE.sub(DUMMY, PLACEHOLDER.sub(DUMMY, line))
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    tokens = list(lexer)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token in SEPARATORS:
            commands.append(words)
            words = []
        elif token in REDIRECTIONS:
            index += 1  # and its file
        else:
            words.append(token)
        index += 1
    commands.append(words)
    return [[w for w in words if w not in "{}"] for words in commands if [w for w in words if w not in "{}"]]


def environment(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """The leading ``NAME=value`` assignments of a command, and the command without them."""
    assigned = {}
    while words and ASSIGNMENT.match(words[0]):
        name, value = words[0].split("=", 1)
        assigned[name] = value
        words = words[1:]
    return assigned, words


def commands_in(markdown: str) -> list[tuple[int, str, list[str], dict[str, str]]]:
    """(block line, command line, words, environment) for every simple command of every shell
    block; the environment is what the command sets before its program and what the block
    exported before it."""
    found, functions = [], set()
    for start, lines in shell_blocks(markdown):
        exported: dict[str, str] = {}
        for line in logical_lines(lines):
            for words in simple_commands(line, functions):
                assigned, words = environment(words)
                if words and words[0] == "export":
                    exported.update(environment(words[1:])[0])
                if words:
                    found.append((start, line.strip(), words, {**exported, **assigned}))
    return [found_one for found_one in found if found_one[2][0] not in functions]


# --- Checks ----------------------------------------------------------------------------


def check_manage(args: list[str]) -> str | None:
    if not args:
        return "manage.py without a command"
    name, rest = args[0], args[1:]
    commands = get_commands()
    if name not in commands:
        return f"manage.py has no command {name!r}"
    command = load_command_class(commands[name], name)
    parser = command.create_parser("manage.py", name)
    try:
        parser.parse_args(rest)
    except (CommandError, SystemExit) as error:
        return f"manage.py {name} refuses {rest}: {error}"
    return None


def check_module(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return f"no module {module!r}"
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, timeout=60, check=False
    )
    return None if result.returncode == 0 else f"python -m {module} --help exits {result.returncode}"


def check_python(args: list[str]) -> str | None:
    while args and args[0] in {"-u", "-B", "-O", "-X"}:
        args = args[1:]
    if not args:
        return "python alone: an interactive shell"
    if args[0] == "manage.py" or args[0].endswith("/manage.py"):
        return check_manage(args[1:])
    if args[0] == "-m" and len(args) > 1:
        return check_module(args[1])
    if args[0] == "-c":
        return None
    return None if (ROOT / args[0]).exists() else f"no script {args[0]}"


def makefile() -> str:
    return (ROOT / "Makefile").read_text()


def make_targets() -> dict[str, str]:
    """Each target of the Makefile and its recipe (continuation lines joined)."""
    targets: dict[str, str] = {}
    current: list[str] = []
    for line in makefile().replace("\\\n", " ").splitlines():
        rule = re.match(r"^([^\s#:=][^:=]*?)\s*:(?![=])", line)
        if rule and not line.startswith("\t"):
            current = rule.group(1).split()
            for target in current:
                targets.setdefault(target, "")
        elif line.startswith("\t"):
            for target in current:
                targets[target] += line.strip() + "\n"
    return targets


def check_make(args: list[str]) -> str | None:
    targets = make_targets()
    names = [a for a in args if not a.startswith("-") and not ASSIGNMENT.match(a)]
    variables = dict(a.split("=", 1) for a in args if ASSIGNMENT.match(a))
    for name in names or ["run"]:
        if name not in targets:
            return f"the Makefile has no target {name!r}"
        for variable, value in variables.items():
            # A variable the target's recipe hands to manage.py: parsed with the rest of that line.
            for recipe_line in targets[name].splitlines():
                if f"$({variable})" in recipe_line and "manage.py " in recipe_line:
                    tail = recipe_line.split("manage.py ", 1)[1].replace(f"$({variable})", value)
                    problem = check_manage(shlex.split(MAKE_VARIABLE.sub(DUMMY, tail)))
                    if problem:
                        return f"make {name} {variable}={value!r}: {problem}"
    return None


def procfile_processes() -> set[str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return {line.split(":", 1)[0] for line in lines if line and not line.startswith("#")}


def check_honcho(args: list[str]) -> str | None:
    if not args or args[0] != "start":
        return f"honcho {args}: only `honcho start PROCESS...` is checked"
    words, index = [], 1
    while index < len(args):
        if args[index] in {"-f", "--procfile", "-d", "--app-root", "-p", "--port", "-e", "--env"}:
            index += 2
            continue
        words.append(args[index])
        index += 1
    missing = [w for w in words if w not in procfile_processes()]
    return f"the Procfile has no process {missing}" if missing else None


CELERY_VALUE_OPTIONS = {"-A", "--app", "-b", "--broker", "--result-backend", "--loader", "--config", "--workdir"}


def option_names(command) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)}


def check_celery(args: list[str]) -> str | None:
    from celery.app.utils import find_app
    from celery.bin.celery import celery as celery_group

    app, index = None, 0
    while index < len(args) and args[index].startswith("-"):
        option = args[index].split("=", 1)[0]
        if option not in option_names(celery_group):
            return f"celery has no option {option}"
        if option in {"-A", "--app"}:
            app = args[index].split("=", 1)[1] if "=" in args[index] else args[index + 1]
        index += 2 if option in CELERY_VALUE_OPTIONS and "=" not in args[index] else 1
    if app is None:
        return "celery without -A"
    try:
        find_app(app)
    except Exception as error:
        return f"celery -A {app}: {error!r}"
    if index >= len(args):
        return "celery without a sub-command"
    sub = celery_group.commands.get(args[index])
    if sub is None:
        return f"celery has no sub-command {args[index]!r}"
    known = option_names(sub)
    unknown = [word for word in args[index + 1 :] if word.startswith("-") and word.split("=", 1)[0] not in known]
    return f"celery {args[index]} has no option {unknown}" if unknown else None


def check_gunicorn(args: list[str]) -> str | None:
    import gunicorn.config

    try:
        parsed = gunicorn.config.Config().parser().parse_args(args)
    except SystemExit:
        return f"gunicorn refuses {args}"
    module = (parsed.args or [""])[0].split(":", 1)[0]
    return None if module and importlib.util.find_spec(module) else f"gunicorn: no application module {module!r}"


VENV_TOOLS = {"python", "python3", "python3.11", "honcho", "celery", "gunicorn"}
SETTINGS_NEED = {"DJANGO_DEBUG", "DJANGO_SECRET_KEY"}


def check_fresh_shell(words: list[str], env: dict[str, str], development: bool) -> str | None:
    """A development command works in a fresh shell in the repository: the venv's programs by
    their path (nothing activated), and manage.py with DJANGO_DEBUG=1 (or a secret key), which
    settings.py needs."""
    program = words[0]
    development = development or env.get("DJANGO_DEBUG") == "1" or program.startswith(".venv/")
    if not development:
        return None
    if program in VENV_TOOLS:
        return f"{program} needs an activated virtualenv: write .venv/bin/{program}, or a make target"
    runs_manage = program in PYTHONS and any(w == "manage.py" or w.endswith("/manage.py") for w in words[1:2])
    if runs_manage and not SETTINGS_NEED & set(env):
        return "manage.py needs DJANGO_DEBUG=1 (or DJANGO_SECRET_KEY) in its environment: put it before the command"
    return None


def check(words: list[str], env: dict[str, str] | None = None, development: bool = False) -> str | None:
    problem = check_fresh_shell(words, env or {}, development)
    if problem:
        return problem
    program, args = words[0], words[1:]
    if program in PYTHONS:
        return check_python(args)
    if program == "make":
        return check_make(args)
    if program in CELERYS:
        return check_celery(args)
    if program in HONCHOS:
        return check_honcho(args)
    if program in GUNICORNS:
        return check_gunicorn(args)
    if program in NOT_CHECKED:
        return None
    return f"unknown program {program!r}: check it here, or add it to NOT_CHECKED with a reason"


def problems(markdown: str, development: bool = False) -> list[str]:
    """What fails in the page's commands; ``development``: every command is run in a fresh
    shell in the repository (the README and the tutorial)."""
    found = []
    for start, line, words, env in commands_in(markdown):
        problem = check(words, env, development)
        if problem:
            found.append(f"block at line {start}: {line!r}: {problem}")
    return found


# --- The docs --------------------------------------------------------------------------


# processes: a `python -m <module>` without a parser of its own is checked by `--help` in a
# child process (make test-fast leaves the pages out; make test checks them).
@pytest.mark.processes
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_command_in_the_page_runs_as_written(page):
    assert not problems(page.read_text(), development=page in FRESH_SHELL)


def test_the_pages_hold_the_commands_this_test_knows_how_to_check():
    words = [w for page in PAGES for _, _, w, _ in commands_in(page.read_text())]
    programs = {w[0] for w in words}
    assert {"make", ".venv/bin/python", "celery", "curl"} <= programs
    assert sum(1 for w in words if w[:2] == ["python", "manage.py"] or w[:2] == [".venv/bin/python", "manage.py"]) > 10


# --- The checker itself ----------------------------------------------------------------


def snippet(*lines: str, language: str = "sh") -> str:
    return "\n".join(["Some prose.", "", f"```{language}", *lines, "```", ""])


@pytest.mark.parametrize(
    "command",
    [
        "python manage.py reconcile --no-such-option",
        "python manage.py no_such_command",
        ".venv/bin/python manage.py reconcile --limit many",
        "DJANGO_DEBUG=1 .venv/bin/python manage.py chaos --seed",
        "make no-such-target",
        'make bench BENCH_ARGS="--workers 2 --no-such-flag"',
        "python -m no_such_module",
        "celery -A delaypay no-such-sub-command",
        "celery -A delaypay worker --no-such-option",
        "celery -A no_such_app worker",
        "honcho start no-such-process",
        "frobnicate --all",
        "curl -s http://127.0.0.1:8000/healthz | frobnicate",
        "X=$(frobnicate now)",
    ],
)
def test_a_command_that_cannot_run_as_written_fails(command):
    assert problems(snippet(command))


@pytest.mark.parametrize(
    "lines",
    [
        ["DJANGO_DEBUG=1 DATABASE_URL=postgres://x/y .venv/bin/python manage.py reconcile --limit 100"],
        ["python manage.py reconcile --json  # a comment with a quote's apostrophe"],
        ["python manage.py chaos --seed <seed> --payments $PAYMENTS --workers ${WORKERS}"],
        ["DJANGO_DEBUG=1 .venv/bin/python manage.py reconcile \\", "  --stuck-after 0 \\", "  --overdue-after 0"],
        ['curl -s -d \'{"a": 1,', '   "b": 2}\' http://127.0.0.1/ | jq', "python manage.py reconcile --json"],
        ["make chaos-ci CHAOS_ARGS=\"--seed 7\" && make bench BENCH_ARGS='--workers 2 --profile'"],
        ["f() { curl -s $1 | jq .; }", "A=$(f x)"],
        ["celery -A delaypay worker -Q execute -P prefork -c 4 -n w@%h --without-gossip -l INFO"],
    ],
)
def test_a_command_that_runs_as_written_passes(lines):
    assert problems(snippet(*lines)) == []


@pytest.mark.parametrize(
    "lines",
    [
        ["python manage.py reconcile"],
        [".venv/bin/python manage.py reconcile"],
        ["export DJANGO_DEBUG=1", "python manage.py reconcile"],
        ["honcho start worker"],
        ["DJANGO_DEBUG=1 celery -A delaypay worker -Q execute"],
    ],
)
def test_a_development_command_that_needs_an_activated_venv_or_settings_fails(lines):
    assert problems(snippet(*lines), development=True)


def test_a_development_command_by_the_venvs_path_with_its_settings_passes():
    lines = [
        "DJANGO_DEBUG=1 .venv/bin/python manage.py reconcile",
        "export DJANGO_DEBUG=1",
        ".venv/bin/python manage.py migrate",
    ]
    assert problems(snippet(*lines, "make run"), development=True) == []
    # On a deployed host (a how-to's production block) the host's python runs manage.py.
    assert problems(snippet("python manage.py reconcile"), development=False) == []


def test_only_the_prompted_lines_of_a_console_block_are_commands():
    text = snippet(
        "$ python manage.py reconcile --json", '{"ok": true}', "frobnicate: not a command", language="console"
    )
    assert [w for _, _, w, _ in commands_in(text)] == [["python", "manage.py", "reconcile", "--json"]]
    assert problems(snippet("$ python manage.py reconcile --nope", "output", language="console"))


def test_blocks_in_other_languages_are_not_commands():
    assert commands_in(snippet("SELECT 1;", language="sql")) == []
    assert commands_in(snippet("frobnicate", language="text")) == []
