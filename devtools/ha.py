"""A highly available PostgreSQL and a Redis behind Sentinel, on loopback, for development
and tests/ha/ (issue 37; docs/decisions/0017-ha-with-pg-auto-failover.md).

PostgreSQL is pg_auto_failover: a monitor and two nodes, each kept by its own
``pg_autoctl run`` (the keeper), on ports PORT (monitor), PORT+1 and PORT+2 (the nodes).
Replication is synchronous: a commit is acknowledged once the secondary has flushed it,
and the monitor promotes only a node that was in sync, so an acknowledged commit survives
the primary's death. Redis is a master and a replica on PORT and PORT+1, watched by three
sentinels on PORT+2..PORT+4 under the master name ``delaypay``.

    python -m devtools.ha up --dir DIR --base-port PORT        # prints DATABASE_URL=...
    python -m devtools.ha status --dir DIR                     # JSON
    python -m devtools.ha kill-primary --dir DIR [--signal KILL|STOP] [--postmaster-only]
    python -m devtools.ha resume --dir DIR                     # SIGCONT after STOP
    python -m devtools.ha down --dir DIR
    python -m devtools.ha redis-up --dir DIR --base-port PORT  # prints REDIS_SENTINEL_URL=...
    python -m devtools.ha redis-down --dir DIR

``up`` and ``redis-up`` on an existing DIR start again whatever is not running. Only stdout
carries the one line of the URL; the logs go to stderr and to DIR/*.log. Nothing listens
beyond 127.0.0.1, and the machine's own PostgreSQL and Redis are never touched.
"""

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Self

import psycopg
import redis

from .sandbox import SandboxError, as_postgres, server_bindir, wait_for

DATABASE = "delaypay"
USER = "root"
NODES = ("node1", "node2")
MONITOR = "monitor"
# Servers that share a 2-core machine with the test suite: small, but durable (fsync on).
SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "shared_buffers": "16MB",
    "max_connections": "40",
    "work_mem": "4MB",
    "maintenance_work_mem": "16MB",
    "effective_cache_size": "128MB",
    "fsync": "on",
    # A commit returns once the synchronous standby has flushed it (pg_auto_failover sets
    # synchronous_standby_names); never "local" or "off", which would acknowledge less.
    "synchronous_commit": "on",
}
# The monitor's failure detection, tightened from the defaults (5 s checks, 20 s to call a
# node unhealthy, 30 s to wait for a demotion) so that a failover takes well under 30 s.
# The demote timeout stays above the keepers' network partition timeout (KEEPER_SETTINGS):
# a primary cut off from the monitor and its standby demotes itself before the other
# node is promoted.
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "1000",
    "pgautofailover.health_check_timeout": "1000",
    "pgautofailover.health_check_max_retries": "2",
    "pgautofailover.health_check_retry_delay": "500",
    "pgautofailover.node_considered_unhealthy_timeout": "4000",
    "pgautofailover.primary_demote_timeout": "10000",
}
KEEPER_SETTINGS = {"timeout.network_partition_timeout": "8"}
STOP_TIMEOUT = 30.0
# The programs we need and the Debian packages that bring them (`make ha-packages`).
PACKAGES = {"pg_autoctl": "postgresql-15-auto-failover", "redis-server": "redis-server",
            "redis-sentinel": "redis-sentinel", "setsid": "util-linux", "setpriv": "util-linux"}


def log(message: str) -> None:
    print(f"devtools.ha: {message}", file=sys.stderr, flush=True)


# --- processes we start: one process group each, its leader's pid in DIR/<name>.pid --------


def start_process(directory: Path, name: str, command: list[str]) -> int:
    """``command`` detached (``setsid --fork``: a session and process group of its own, not our
    child, so it outlives the command that started it), output to DIR/<name>.log, its pid,
    which is also its group's id, to DIR/<name>.pid."""
    pid_file = directory / f"{name}.pid"
    pid_file.unlink(missing_ok=True)
    # The shell writes its own pid, then becomes the command (exec): that pid is the group's.
    record_and_exec = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(pid_file), *command]
    with open(directory / f"{name}.log", "ab") as output:
        subprocess.run(
            [program("setsid"), "--fork", *record_and_exec], cwd=directory, stdout=output, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, check=True, timeout=10,
        )
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip().isdigit(), timeout=10, what=f"{name}'s pid")
    return int(pid_file.read_text())


def wait_started(directory: Path, name: str, answers, timeout: float = 20) -> None:
    """Until ``answers()``; a process that exited first (its port taken, say) fails at once,
    with the end of its log."""

    def ready() -> bool:
        if group_of(directory, name) is None:
            tail = (directory / f"{name}.log").read_text(errors="replace").splitlines()[-5:]
            raise SandboxError(f"{name} exited:\n" + "\n".join(tail))
        return answers()

    wait_for(ready, timeout=timeout, what=name)


def program(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise SandboxError(f"{name} is not installed: `make ha-packages` installs Debian's {PACKAGES[name]}")
    return found


def group_of(directory: Path, name: str) -> int | None:
    """The process group started under ``name``, if its leader is still alive."""
    try:
        pid = int((directory / f"{name}.pid").read_text())
        # Not someone else's process that got the same pid later (ours lead their own group).
        return pid if process_state(pid)[1] == pid else None
    except (OSError, ValueError):
        return None


def process_state(pid: int) -> tuple[str, int, int]:
    """(state, process group, parent) of a live process; OSError for one that is gone or a
    zombie (we start processes detached: our init reaps them when it gets round to it)."""
    # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ")".
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        raise ProcessLookupError(pid)
    return fields[0], int(fields[2]), int(fields[1])


def signal_group(directory: Path, name: str, sig: signal.Signals) -> bool:
    """``sig`` to every process the group's leader started, however deep: PostgreSQL's
    backends and auxiliary processes each run in a session of their own, and a frozen node
    is one whose walsender and backends are frozen too. False when it is not running."""
    pgid = group_of(directory, name)
    if pgid is None:
        return False
    signal_tree(pgid, sig)
    return True


def signal_tree(pgid: int, sig: signal.Signals) -> None:
    for pid in process_tree(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def alive(pid: int) -> bool:
    try:
        process_state(pid)
    except (OSError, ValueError, IndexError):
        return False
    return True


def process_tree(pgid: int) -> list[int]:
    """The live members of process group ``pgid`` and all their descendants, parents first."""
    parents, groups = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(stat.parent.name)
            _, groups[pid], parents[pid] = process_state(pid)
    tree = [pid for pid, group in groups.items() if group == pgid]
    for pid in tree:  # grows as it goes: breadth first
        tree += [child for child, parent in parents.items() if parent == pid and child not in tree]
    return tree


def stop_group(directory: Path, name: str, terminate=None, timeout: float = STOP_TIMEOUT) -> None:
    """SIGCONT to every process of it (a frozen node's backends too), then ``terminate()``
    (default: SIGTERM to the group), then SIGKILL to whatever is left after ``timeout``."""
    pgid = group_of(directory, name)
    if pgid is not None:
        signal_tree(pgid, signal.SIGCONT)
        if terminate is not None:
            terminate()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while process_tree(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if process_tree(pgid):
            log(f"{name} did not stop within {timeout:.0f}s: SIGKILL")
            signal_tree(pgid, signal.SIGKILL)
    (directory / f"{name}.pid").unlink(missing_ok=True)


@dataclass
class SavedLayout:
    """A directory and its base port, remembered in DIR/<FILE> so that later commands need
    only --dir."""

    directory: Path
    base_port: int
    FILE: ClassVar[str] = "ha.json"
    WHAT: ClassVar[str] = "cluster"

    @classmethod
    def load(cls, directory: Path) -> Self:
        try:
            saved = json.loads((directory / cls.FILE).read_text())
        except FileNotFoundError:
            raise SandboxError(f"no {cls.WHAT} in {directory} (no {cls.FILE}): start it first") from None
        return cls(directory=directory, base_port=saved["base_port"])

    @classmethod
    def open(cls, directory: Path, base_port: int) -> Self:
        """The layout saved in ``directory``, or a new one saved there; refuses another port."""
        if (directory / cls.FILE).exists():
            layout = cls.load(directory)
            if layout.base_port != base_port:
                raise SandboxError(f"{directory} holds a {cls.WHAT} on base port {layout.base_port}, not {base_port}")
            return layout
        layout = cls(directory=directory, base_port=base_port)
        (directory / cls.FILE).write_text(json.dumps({"base_port": base_port}))
        return layout


# --- PostgreSQL: pg_auto_failover -----------------------------------------------------------


class Layout(SavedLayout):
    """Where a cluster lives: DIR and its ports."""

    @property
    def monitor_port(self) -> int:
        return self.base_port

    def port(self, node: str) -> int:
        return self.base_port + 1 + NODES.index(node)

    def pgdata(self, name: str) -> Path:
        return self.directory / name

    @property
    def monitor_uri(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover?sslmode=prefer"

    @property
    def database_url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{self.port(node)}" for node in NODES)
        return f"postgresql://{USER}@{hosts}/{DATABASE}?target_session_attrs=read-write"

    def dsn(self, port: int, *, user: str = USER, dbname: str = DATABASE) -> str:
        return f"host=127.0.0.1 port={port} user={user} dbname={dbname} connect_timeout=2"


def pg_autoctl() -> str:
    return program("pg_autoctl")


XDG_DIRECTORIES = {"XDG_CONFIG_HOME": "config", "XDG_DATA_HOME": "share", "XDG_RUNTIME_DIR": "run"}


def autoctl_command(layout: Layout, *args: str) -> list[str]:
    """pg_autoctl as the postgres user when we are root (it refuses root, as PostgreSQL does),
    its configuration and state files kept inside DIR rather than in a home directory.
    ``setpriv`` rather than ``runuser``: it becomes the program instead of waiting for it, and
    a waiting runuser stopped and continued with its child can stop itself again for good."""
    env = [f"{key}={layout.directory / sub}" for key, sub in XDG_DIRECTORIES.items()]
    if os.geteuid() == 0:
        become = [program("setpriv"), "--reuid=postgres", "--regid=postgres", "--init-groups"]
        env.append("HOME=/var/lib/postgresql")
    else:
        become = []
    return [*become, "/usr/bin/env", *env, pg_autoctl(), *args]


def autoctl(layout: Layout, *args: str, timeout: float = 120) -> str:
    """Run pg_autoctl to its end; its log (stderr) is appended to DIR/pg_autoctl.log."""
    proc = subprocess.run(
        autoctl_command(layout, *args), cwd=layout.directory, capture_output=True, text=True,
        stdin=subprocess.DEVNULL, timeout=timeout, check=False,
    )
    with open(layout.directory / "pg_autoctl.log", "a") as output:
        output.write(f"$ pg_autoctl {' '.join(args)}\n{proc.stderr}")
    if proc.returncode != 0:
        raise SandboxError(f"pg_autoctl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def own_directory(directory: Path) -> None:
    """DIR and pg_autoctl's directories in it, the postgres user's when we are root. The
    runtime one must exist: without it pg_autoctl keeps its pid files in /tmp/pg_autoctl."""
    for path in (directory, *(directory / sub for sub in XDG_DIRECTORIES.values())):
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(path, user="postgres", group="postgres")
        path.chmod(0o700)


def initdb(layout: Layout, name: str, extra: dict[str, str] | None = None) -> None:
    """A data directory with our settings, in an included file that comes after (and so
    overrides) the one pg_autoctl writes: it sizes shared_buffers after the machine's memory.
    A standby's pg_basebackup copies the file with the rest."""
    bindir = server_bindir()
    pgdata = layout.pgdata(name)
    subprocess.run(
        as_postgres(str(bindir / "initdb"), "-D", str(pgdata), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                    "--locale=C", "--no-sync"),
        capture_output=True, text=True, stdin=subprocess.DEVNULL, check=True, timeout=120,
    )
    write_as_postgres(pgdata / "delaypay-ha.conf", settings_text({**SERVER_SETTINGS, **(extra or {})}))
    with open(pgdata / "postgresql.conf", "a") as conf:
        conf.write("\ninclude_if_exists 'delaypay-ha.conf'\n")


def settings_text(settings: dict[str, str]) -> str:
    lines = [f"{key} = '{value}'" for key, value in settings.items()]
    return "# devtools/ha.py: a small, loopback-only server\n" + "\n".join(lines) + "\n"


def write_as_postgres(path: Path, text: str) -> None:
    path.write_text(text)
    if os.geteuid() == 0:
        shutil.chown(path, user="postgres", group="postgres")


def create_monitor(layout: Layout) -> None:
    initdb(layout, MONITOR, MONITOR_SETTINGS)
    autoctl(
        layout, "create", "monitor", "--pgdata", str(layout.pgdata(MONITOR)), "--pgctl", pg_ctl(),
        "--pgport", str(layout.monitor_port), "--hostname", "127.0.0.1", "--listen", "127.0.0.1",
        "--auth", "trust", "--no-ssl",
    )


def create_node(layout: Layout, node: str) -> None:
    """Register ``node`` with the monitor: the first becomes the primary (on a data directory
    made here), the second a standby made by pg_basebackup from it."""
    if node == NODES[0]:
        initdb(layout, node)
    autoctl(
        layout, "create", "postgres", "--pgdata", str(layout.pgdata(node)), "--pgctl", pg_ctl(),
        "--pgport", str(layout.port(node)), "--hostname", "127.0.0.1", "--listen", "127.0.0.1",
        "--name", node, "--dbname", DATABASE, "--monitor", layout.monitor_uri, "--auth", "trust", "--no-ssl",
        timeout=300,
    )
    for key, value in KEEPER_SETTINGS.items():
        autoctl(layout, "config", "set", "--pgdata", str(layout.pgdata(node)), key, value)


def pg_ctl() -> str:
    return str(server_bindir() / "pg_ctl")


def start_keeper(layout: Layout, name: str) -> None:
    if group_of(layout.directory, name) is None:
        log(f"starting {name}")
        start_process(layout.directory, name, autoctl_command(layout, "run", "--pgdata", str(layout.pgdata(name))))


def created(layout: Layout, name: str) -> bool:
    config = layout.directory / "config" / "pg_autoctl" / str(layout.pgdata(name)).lstrip("/") / "pg_autoctl.cfg"
    return config.exists()


def nodes_state(layout: Layout) -> list[dict]:
    """The monitor's view of the nodes ([] when the monitor does not answer)."""
    try:
        with psycopg.connect(layout.dsn(layout.monitor_port, user="postgres", dbname="pg_auto_failover"),
                             autocommit=True) as conn:
            rows = conn.execute(
                "SELECT nodename, nodeport, reportedstate::text, goalstate::text, reportedrepstate, health,"
                "       reportedlsn::text FROM pgautofailover.node ORDER BY nodeid"
            ).fetchall()
    except psycopg.Error:
        return []
    keys = ("name", "port", "reported", "goal", "replication", "health", "lsn")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def in_sync(nodes: list[dict]) -> bool:
    """A primary and a secondary, each in the state the monitor assigned it."""
    settled = sorted(n["reported"] for n in nodes if n["reported"] == n["goal"])
    return len(nodes) == len(NODES) and settled == ["primary", "secondary"]


def streaming(layout: Layout) -> bool:
    """The monitor's primary, asked itself: writable, with a synchronous standby streaming
    (the monitor's view may be older than a restart)."""
    primary = primary_of(nodes_state(layout))
    if primary is None:
        return False
    try:
        with psycopg.connect(layout.dsn(layout.port(primary), user="postgres"), autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_is_in_recovery(),"
                "       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))"
            ).fetchone()
    except psycopg.Error:
        return False
    return row == (False, 1)


def primary_of(nodes: list[dict]) -> str | None:
    """The node the monitor has (or is making) the primary, if any."""
    for node in nodes:
        if node["goal"] in ("primary", "wait_primary", "single") and node["reported"] == node["goal"]:
            return node["name"]
    return None


def ensure_root_role(layout: Layout, node: str) -> None:
    """Our ``root`` role, superuser with trust on loopback as on the machine's cluster."""
    wait_for(lambda: node_answers(layout, node), timeout=60, what=f"{node} to accept connections")
    with psycopg.connect(layout.dsn(layout.port(node), user="postgres"), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [USER]).fetchone():
            conn.execute(f"CREATE ROLE {USER} SUPERUSER LOGIN")
        conn.execute(f"ALTER DATABASE {DATABASE} OWNER TO {USER}")


def up(directory: Path, base_port: int, *, timeout: float = 180) -> str:
    """Create (first time) or start again the monitor and both nodes; wait until the monitor
    reports a primary and a secondary in sync; the multi-host DATABASE_URL."""
    pg_autoctl()
    directory = directory.resolve()
    own_directory(directory)
    layout = Layout.open(directory, base_port)
    # Started again: the nodes first, so that the monitor, which last heard of them before
    # they stopped, finds them up at its first health check and has nothing to fail over.
    for name in (*NODES, MONITOR):
        if created(layout, name):
            start_keeper(layout, name)
    create_missing(layout, timeout=timeout)
    nudge = CheckpointNudge(layout)
    wait_for(lambda: nudge() and keep_running(layout) and in_sync(nodes_state(layout)) and streaming(layout),
             timeout=timeout, what="a primary and a secondary in sync", interval=0.5)
    log(f"in sync: {json.dumps(nodes_state(layout))}")
    return layout.database_url


class CheckpointNudge:
    """A node that returns after a failover is rebuilt from the primary when pg_rewind
    cannot rewind it, and pg_basebackup waits for the primary's next checkpoint, which is
    spread over minutes. A CHECKPOINT on the primary every few seconds while waiting makes
    it immediate. Always true, so that it can lead a wait's condition."""

    def __init__(self, layout: Layout, every: float = 3.0):
        self.layout, self.every, self.last = layout, every, 0.0

    def __call__(self) -> bool:
        if time.monotonic() - self.last < self.every:
            return True
        self.last = time.monotonic()
        primary = primary_of(nodes_state(self.layout))
        if primary is not None:
            try:
                with psycopg.connect(self.layout.dsn(self.layout.port(primary), user="postgres"),
                                     autocommit=True) as conn:
                    conn.execute("CHECKPOINT")
            except psycopg.Error:
                pass  # not up yet, or not the primary any more: the next look tries again
        return True


def keep_running(layout: Layout) -> bool:
    """Start again a keeper that exited while we wait: one started right after its node was
    killed may find its predecessor's pid still taken (a zombie our init has not yet reaped)
    and give up."""
    for name in (*NODES, MONITOR):
        start_keeper(layout, name)
    return True


def create_missing(layout: Layout, *, timeout: float) -> None:
    """Whatever the first ``up`` (or one that failed half-way) has not made yet, in order:
    the monitor, the primary, our role on it, the standby."""
    primary, standby = NODES
    if not created(layout, MONITOR):
        log(f"creating the monitor on 127.0.0.1:{layout.monitor_port}")
        create_monitor(layout)
        start_keeper(layout, MONITOR)
    wait_started(layout.directory, MONITOR, lambda: monitor_answers(layout), timeout=60)
    if not created(layout, primary):
        log(f"creating {primary} on 127.0.0.1:{layout.port(primary)}")
        create_node(layout, primary)
        start_keeper(layout, primary)
    if not created(layout, standby):
        wait_for(lambda: primary_of(nodes_state(layout)) == primary, timeout=timeout, what=f"{primary} to run",
                 interval=0.5)
        ensure_root_role(layout, primary)  # before the standby is made: it copies the role
        log(f"creating {standby} on 127.0.0.1:{layout.port(standby)}")
        create_node(layout, standby)
        start_keeper(layout, standby)


def answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def monitor_answers(layout: Layout) -> bool:
    return answers(layout.dsn(layout.monitor_port, user="postgres", dbname="pg_auto_failover"))


def node_answers(layout: Layout, node: str) -> bool:
    return answers(layout.dsn(layout.port(node), user="postgres", dbname="postgres"))


def down(directory: Path) -> None:
    """Stop the monitor's keeper, then the secondary's, then the primary's, each stopping its
    PostgreSQL: with no monitor to decide, nothing fails over on the way down, and the next
    ``up`` finds the roles as they were. DIR stays."""
    if not (directory / Layout.FILE).exists():
        log(f"no cluster in {directory}: nothing to stop")
        return
    layout = Layout.load(directory.resolve())
    primary = primary_of(nodes_state(layout))
    for name in (MONITOR, *sorted(NODES, key=lambda node: node == primary)):
        # `pg_autoctl stop` signals the keeper alone, which stops its services and PostgreSQL
        # in order; a SIGTERM to its whole group would race its restart of those services.
        stop_group(layout.directory, name, lambda name=name: autoctl_stop(layout, name))
    for name in (*NODES, MONITOR):
        kill_orphan_postmaster(layout.pgdata(name))


def autoctl_stop(layout: Layout, name: str) -> None:
    try:
        autoctl(layout, "stop", "--pgdata", str(layout.pgdata(name)), timeout=30)
    except (SandboxError, subprocess.TimeoutExpired) as exc:
        log(f"pg_autoctl stop of {name}: {exc}")


def kill_orphan_postmaster(pgdata: Path) -> None:
    """A postmaster that outlived its keeper (killed with SIGKILL, say): stopped all the same."""
    pid = postmaster_pid(pgdata)
    if pid is not None:
        log(f"stopping a postmaster left running in {pgdata}")
        os.kill(pid, signal.SIGQUIT)
        wait_for(lambda: not alive(pid), timeout=STOP_TIMEOUT, what="the postmaster to stop")


def status(directory: Path) -> dict:
    layout = Layout.load(directory.resolve())
    nodes = nodes_state(layout)
    for node in nodes:
        node["keeper_running"] = group_of(layout.directory, node["name"]) is not None
    return {
        "database_url": layout.database_url,
        "monitor": {"port": layout.monitor_port, "running": group_of(layout.directory, MONITOR) is not None},
        "nodes": nodes,
        "primary": primary_of(nodes),
        "in_sync": in_sync(nodes),
    }


def kill_primary(directory: Path, sig: signal.Signals = signal.SIGKILL, *, postmaster_only: bool = False) -> str:
    """Send ``sig`` to the primary's whole node, its keeper and its PostgreSQL (a dead or a
    frozen machine), or with ``postmaster_only`` to its postmaster alone (a crash of
    PostgreSQL, which its keeper answers by starting it again). Returns the node's name."""
    layout = Layout.load(directory.resolve())
    primary = primary_of(nodes_state(layout))
    if primary is None:
        raise SandboxError("the monitor reports no primary")
    if postmaster_only:
        pid = postmaster_pid(layout.pgdata(primary))
        if pid is None:
            raise SandboxError(f"{primary}'s postmaster is not running")
        os.kill(pid, sig)
        log(f"sent {sig.name} to {primary}'s postmaster ({pid})")
    else:
        signal_node(directory, primary, sig)
    return primary


def postmaster_pid(pgdata: Path) -> int | None:
    """The postmaster running on ``pgdata`` (its postmaster.pid, checked against /proc)."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return pid if str(pgdata).encode() in cmdline and alive(pid) else None


def signal_node(directory: Path, node: str, sig: signal.Signals) -> None:
    if not signal_group(directory.resolve(), node, sig):
        raise SandboxError(f"{node}'s keeper is not running")
    log(f"sent {sig.name} to {node}")


def resume(directory: Path) -> None:
    """SIGCONT to every node, stopped or not."""
    for node in NODES:
        signal_group(directory.resolve(), node, signal.SIGCONT)


def wait_for_new_primary(directory: Path, old: str, timeout: float = 60) -> str:
    """The node other than ``old`` once the monitor has made it the primary."""
    layout = Layout.load(directory.resolve())
    found: list[str] = []

    def promoted() -> bool:
        primary = primary_of(nodes_state(layout))
        if primary is not None and primary != old:
            found.append(primary)
            return True
        return False

    wait_for(promoted, timeout=timeout, what=f"a primary other than {old}", interval=0.2)
    return found[-1]


def switchover(directory: Path, timeout: float = 120) -> str:
    """A planned switchover (the monitor's perform_failover, as ``pg_autoctl perform
    switchover`` asks for it): the primary hands over to the secondary in sync; the new
    primary."""
    layout = Layout.load(directory.resolve())
    old = primary_of(nodes_state(layout))
    if old is None:
        raise SandboxError("the monitor reports no primary")
    with psycopg.connect(layout.dsn(layout.monitor_port, user="postgres", dbname="pg_auto_failover"),
                         autocommit=True) as conn:
        conn.execute("SELECT pgautofailover.perform_failover('default', 0)")
    log(f"switchover from {old} asked of the monitor")
    return wait_for_new_primary(directory, old, timeout)


# --- Redis behind Sentinel --------------------------------------------------------------------

MASTER_NAME = "delaypay"
REDIS_NODES = ("redis1", "redis2")
SENTINELS = ("sentinel1", "sentinel2", "sentinel3")
SENTINEL_QUORUM = 2
SENTINEL_DOWN_AFTER_MS = 2000
SENTINEL_FAILOVER_TIMEOUT_MS = 10000


class RedisLayout(SavedLayout):
    """Where a Redis set lives: DIR and its ports."""

    FILE: ClassVar[str] = "redis.json"
    WHAT: ClassVar[str] = "Redis set"

    def port(self, name: str) -> int:
        return self.base_port + (*REDIS_NODES, *SENTINELS).index(name)

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", self.port(name)) for name in SENTINELS]

    @property
    def sentinel_url(self) -> str:
        """kombu's form for broker_url (with broker_transport_options={"master_name": ...})."""
        return ";".join(f"sentinel://{host}:{port}/0" for host, port in self.sentinel_addresses)



def sentinel_command(config: Path) -> list[str]:
    """Debian's redis-sentinel; without it, redis-server in sentinel mode (the same program)."""
    if shutil.which("redis-sentinel"):
        return [program("redis-sentinel"), str(config)]
    return [program("redis-server"), str(config), "--sentinel"]


def current_master(layout: RedisLayout) -> tuple[str, int] | None:
    """The master as the first sentinel that answers names it."""
    for host, port in layout.sentinel_addresses:
        try:
            client = redis.Redis(host=host, port=port, socket_timeout=0.5, socket_connect_timeout=0.5)
            with contextlib.closing(client):
                address = client.execute_command("SENTINEL", "get-master-addr-by-name", MASTER_NAME)
        except redis.RedisError:
            continue
        if address:
            return address[0].decode(), int(address[1])
    return None


def start_redis(layout: RedisLayout, name: str, master: tuple[str, int] | None) -> None:
    """A redis-server without persistence. Started again after a crash it comes back as a
    replica of the current master: an empty master would otherwise hand its emptiness on."""
    if group_of(layout.directory, name) is not None:
        return
    data = layout.directory / name
    data.mkdir(exist_ok=True)
    command = [program("redis-server"), "--port", str(layout.port(name)), "--bind", "127.0.0.1",
               "--dir", str(data), "--save", "", "--appendonly", "no"]
    role = "master"
    if master is not None and master[1] != layout.port(name):
        command += ["--replicaof", master[0], str(master[1])]
        role = f"replica of {master[0]}:{master[1]}"
    log(f"starting {name} on 127.0.0.1:{layout.port(name)}, {role}")
    start_process(layout.directory, name, command)
    wait_started(layout.directory, name, lambda: redis_answers(layout.port(name)))


def redis_answers(port: int) -> bool:
    try:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5, socket_connect_timeout=0.5)
        with contextlib.closing(client):
            return bool(client.ping())
    except redis.RedisError:
        return False


def start_sentinel(layout: RedisLayout, name: str, master_port: int) -> None:
    """A sentinel with its own configuration file, which it rewrites as it learns."""
    if group_of(layout.directory, name) is not None:
        return
    config = layout.directory / f"{name}.conf"
    if not config.exists():
        config.write_text("\n".join([
            f"port {layout.port(name)}",
            "bind 127.0.0.1",
            f"dir {layout.directory}",
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {SENTINEL_QUORUM}",
            f"sentinel down-after-milliseconds {MASTER_NAME} {SENTINEL_DOWN_AFTER_MS}",
            f"sentinel failover-timeout {MASTER_NAME} {SENTINEL_FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {MASTER_NAME} 1",
            "",
        ]))
    log(f"starting {name} on 127.0.0.1:{layout.port(name)}")
    start_process(layout.directory, name, sentinel_command(config))
    wait_started(layout.directory, name, lambda: redis_answers(layout.port(name)))


def redis_in_sync(layout: RedisLayout) -> bool:
    """Every sentinel names the same master, sees the other two sentinels and one replica,
    and that replica's link to the master is up."""
    masters = set()
    for host, port in layout.sentinel_addresses:
        try:
            client = redis.Redis(host=host, port=port, socket_timeout=0.5, socket_connect_timeout=0.5,
                                 decode_responses=True)
            with contextlib.closing(client):
                master = client.sentinel_master(MASTER_NAME)
                replicas = client.sentinel_slaves(MASTER_NAME)
        except redis.RedisError:
            return False
        healthy = [r for r in replicas if "s_down" not in r["flags"] and "o_down" not in r["flags"]
                   and r.get("master-link-status") == "ok"]
        if master["num-other-sentinels"] != len(SENTINELS) - 1 or len(healthy) != 1:
            return False
        masters.add((master["ip"], master["port"]))
    return len(masters) == 1


def redis_up(directory: Path, base_port: int, *, timeout: float = 60) -> str:
    """Start (or start again) the master, the replica and three sentinels; wait until the
    sentinels agree; the sentinels' URL for kombu."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    layout = RedisLayout.open(directory, base_port)
    master = current_master(layout) or ("127.0.0.1", layout.port(REDIS_NODES[0]))
    for name in REDIS_NODES:
        start_redis(layout, name, master)
    for name in SENTINELS:
        start_sentinel(layout, name, master[1])
    wait_for(lambda: redis_in_sync(layout), timeout=timeout, what="the sentinels to agree on a master and a replica",
             interval=0.5)
    log(f"master {current_master(layout)}; Celery needs broker_url=<the URL> and "
        f"broker_transport_options={{'master_name': '{MASTER_NAME}'}}")
    return layout.sentinel_url


def redis_down(directory: Path) -> None:
    directory = directory.resolve()
    for name in (*SENTINELS, *REDIS_NODES):
        stop_group(directory, name, timeout=10)


def kill_redis_master(directory: Path, sig: signal.Signals = signal.SIGKILL) -> str:
    """Send ``sig`` to the redis-server the sentinels call the master; its name."""
    layout = RedisLayout.load(directory.resolve())
    master = current_master(layout)
    if master is None:
        raise SandboxError("no sentinel names a master")
    name = next(n for n in REDIS_NODES if layout.port(n) == master[1])
    if not signal_group(layout.directory, name, sig):
        raise SandboxError(f"{name} is not running")
    log(f"sent {sig.name} to {name}")
    return name


# --- command line -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devtools.ha", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "redis-up"):
        command = commands.add_parser(name)
        command.add_argument("--dir", type=Path, required=True)
        command.add_argument("--base-port", type=int, required=True)
    for name in ("down", "status", "redis-down"):
        commands.add_parser(name).add_argument("--dir", type=Path, required=True)
    for name in ("kill-primary", "kill-redis-master"):
        command = commands.add_parser(name)
        command.add_argument("--dir", type=Path, required=True)
        command.add_argument("--signal", choices=("KILL", "STOP"), default="KILL")
        if name == "kill-primary":
            command.add_argument("--postmaster-only", action="store_true",
                                 help="signal the postmaster alone (its keeper starts it again)")
    commands.add_parser("resume", help="SIGCONT to every node (after kill-primary --signal STOP)").add_argument(
        "--dir", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "up":
            print(f"DATABASE_URL={up(args.dir, args.base_port)}", flush=True)
        elif args.command == "down":
            down(args.dir)
        elif args.command == "status":
            print(json.dumps(status(args.dir), indent=2))
        elif args.command == "kill-primary":
            print(kill_primary(args.dir, signal.Signals[f"SIG{args.signal}"], postmaster_only=args.postmaster_only))
        elif args.command == "resume":
            resume(args.dir)
        elif args.command == "redis-up":
            print(f"REDIS_SENTINEL_URL={redis_up(args.dir, args.base_port)}", flush=True)
        elif args.command == "redis-down":
            redis_down(args.dir)
        elif args.command == "kill-redis-master":
            print(kill_redis_master(args.dir, signal.Signals[f"SIG{args.signal}"]))
    except (SandboxError, subprocess.SubprocessError) as exc:
        log(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
