"""The PostgreSQL session settings every delaypay connection carries, merged into the
libpq ``options`` a ``DATABASE_URL`` may bring (``...?options=-c%20search_path%3Dapp``).

Pure string work, no Django: delaypay/settings.py calls it and the tests call it directly.
"""


def session_options(url_options: str | None, required: dict[str, str]) -> str:
    """The URL's own ``options`` followed by ``-c name=value`` for every parameter of
    ``required`` they do not set themselves: nothing of theirs is lost, and where they set
    one of ours (``-c jit=on``), theirs wins."""
    url_options = (url_options or "").strip()
    already_set = parameters_set_by(url_options)
    ours = [f"-c {name}={value}" for name, value in required.items() if _normalise(name) not in already_set]
    return " ".join([url_options, *ours] if url_options else ours)


def parameters_set_by(options: str) -> set[str]:
    """Names of the run-time parameters a libpq ``options`` string sets, as the server reads
    them: ``-c name=value``, ``-cname=value`` and ``--name=value``, case-insensitive, with
    ``-`` in a name read as ``_``."""
    names = set()
    args = iter(_split(options))
    for arg in args:
        if arg == "-c":
            assignment = next(args, "")
        elif arg.startswith("--"):
            assignment = arg[2:]
        elif arg.startswith("-c"):
            assignment = arg[2:]
        else:
            continue
        if "=" in assignment:
            names.add(_normalise(assignment.split("=", 1)[0]))
    return names


def _normalise(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def _split(options: str) -> list[str]:
    """libpq's rule: whitespace separates arguments unless escaped with a backslash, and
    ``\\\\`` is a literal backslash."""
    args: list[str] = []
    current: list[str] = []
    chars = iter(options)
    for char in chars:
        if char == "\\":
            current.append(next(chars, ""))
        elif char.isspace():
            if current:
                args.append("".join(current))
                current = []
        else:
            current.append(char)
    if current:
        args.append("".join(current))
    return args
