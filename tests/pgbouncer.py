"""A real PgBouncer (Debian's package) in transaction mode, in front of the test server.

Started on a free local port with a configuration of its own in a temporary folder;
stopped (and the folder removed) at exit. PgBouncer refuses to run as root: as root it
runs as the ``postgres`` system user, or, for a server on a Unix socket (the suite's
embedded one), as the owner of the socket's folder.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.workers import wait_for

BINARY_PATHS = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def binary() -> str | None:
    """Return the path of the pgbouncer binary, or None when it is not installed."""
    found = shutil.which("pgbouncer")
    return found or next((path for path in BINARY_PATHS if os.path.exists(path)), None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def pgbouncer(server_url: str, *, pool_mode: str = "transaction") -> Iterator[str]:
    """Run PgBouncer in front of ``server_url``'s server; yield a URL for its database."""
    path = binary()
    assert path is not None
    server = conninfo_to_dict(server_url)
    port = _free_port()
    folder = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    user = server.get("user") or "postgres"
    (folder / "userlist.txt").write_text(f'"{user}" "{server.get("password") or ""}"\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server.get('host') or '127.0.0.1'} port={server.get('port') or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'userlist.txt'}\n"
        f"admin_users = {user}\n"
        f"pool_mode = {pool_mode}\n"
        "max_client_conn = 200\ndefault_pool_size = 10\n"
        # psycopg and Django may send these at connect; PgBouncer must not refuse them.
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {folder / 'pgbouncer.log'}\npidfile = {folder / 'pgbouncer.pid'}\n"
    )
    command = [path, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        host = str(server.get("host") or "")
        # A server on a Unix socket (the suite's embedded one) is reachable only by the
        # owner of its socket folder: run as that account; otherwise as postgres.
        account = (
            pwd.getpwuid(os.stat(host).st_uid) if host.startswith("/") else pwd.getpwnam("postgres")
        )
        os.chown(folder, account.pw_uid, account.pw_gid)
        for child in folder.iterdir():
            os.chown(child, account.pw_uid, account.pw_gid)
        command = ["runuser", "-u", account.pw_name, "--", *command]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    url = make_conninfo(
        "", host="127.0.0.1", port=str(port), user=user, dbname=server.get("dbname", "postgres")
    )
    try:
        wait_for(lambda: _accepts(url), timeout=20, message=f"pgbouncer on port {port}")
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def _accepts(url: str) -> bool:
    try:
        with psycopg.connect(url, prepare_threshold=None, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


def transactions_served(url: str) -> int:
    """Return how many transactions PgBouncer passed on to ``url``'s database (SHOW STATS)."""
    settings = conninfo_to_dict(url)
    output = subprocess.run(
        [
            "psql",
            "-h",
            str(settings["host"]),
            "-p",
            str(settings["port"]),
            "-U",
            str(settings["user"]),
            "-d",
            "pgbouncer",
            "-At",
            "-F",
            "|",
            "-c",
            "SHOW STATS",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    for line in output.splitlines():
        fields = line.split("|")
        if fields[0] == settings["dbname"]:
            return int(fields[1])  # total_xact_count
    return 0
