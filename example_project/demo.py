#!/usr/bin/env python
"""``make demo``: the example shop with PostgreSQL, a queue worker and the admin, at once.

Starts the embedded PostgreSQL of this checkout (unless ``DATABASE_URL`` is set), creates
and migrates the shop's database, creates an admin login and prints it, seeds a batch of
orders and jobs, then runs ``manage.py runqueueworker`` and ``manage.py runserver`` until
Ctrl-C. Stopping drains the worker (SIGTERM), stops the web server, and stops the
embedded PostgreSQL if this script started it. Every step is idempotent: run it again and
it reuses the database and the login, and seeds a fresh batch.

``--seconds N`` runs for N seconds instead, logs in to the admin over HTTP, prints a
summary and exits with status 0, or 1 if anything failed (for CI and ``make demo
DEMO_SECONDS=30``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from pathlib import Path
from types import FrameType
from typing import Any, TextIO
from urllib.error import URLError
from urllib.parse import urlencode, urlparse
from urllib.request import HTTPCookieProcessor, Request, build_opener

import psycopg
from shop.database import DEMO_DATABASE, EMBEDDED_ROOT, describe, ensure_database

from django_pgqueue.tools.embedded import EmbeddedPostgres, EmbeddedPostgresError

PROJECT = Path(__file__).resolve().parent
MANAGE = PROJECT / "manage.py"
ADMIN_USERNAME = "admin"
# Seconds the worker gets to drain on SIGTERM before the demo gives up on it; the worker's
# own grace period (PGQUEUE_GRACE_SECONDS, 30 s) is shorter.
WORKER_STOP_TIMEOUT = 60.0
STARTUP_TIMEOUT = 60.0
# What to look for on the queue's admin pages (any others are listed without a note).
QUEUE_PAGE_NOTES = {
    "/admin/django_pgqueue/job/": "every job: filter by status, queue, task; open one for "
    "its attempts, step and errors",
    "/admin/django_pgqueue/deadletter/": "Leipzig's warehouse is down and Alan redeemed "
    "points he lacks: tick Leipzig's 'API online' under Warehouses, then retry them here",
    "/admin/django_pgqueue/worker/": "the worker registry: the demo's worker, alive",
}

_print_lock = threading.Lock()


def say(message: str, prefix: str = "demo") -> None:
    """Print one progress line at once, even with children's output interleaved."""
    with _print_lock:
        print(f"{prefix:>7} | {message}", flush=True)


class DemoError(Exception):
    """A step of the demo failed; the message says which and why."""


class Interrupted(Exception):
    """Ctrl-C (or SIGTERM) arrived during set-up."""


# ---------------------------------------------------------------- subprocesses
class Child:
    """A long-running ``manage.py`` subprocess whose output is echoed with a prefix.

    It runs in its own session, so Ctrl-C in the terminal reaches only this script,
    which then stops the children in the right order.
    """

    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, str(MANAGE), *args],
            cwd=PROJECT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        assert self.process.stdout is not None
        self._pump = threading.Thread(
            target=_echo, args=(self.process.stdout, name), name=f"demo-{name}", daemon=True
        )
        self._pump.start()

    def exit_code(self) -> int | None:
        """Return the exit status, or None while it runs."""
        return self.process.poll()

    def signal(self, signum: int) -> None:
        """Send ``signum`` if it still runs."""
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self, signum: int, timeout: float, *, again: threading.Event | None = None) -> int:
        """Send ``signum`` and wait for the exit; SIGKILL after ``timeout``. Return the status.

        If ``again`` is set while waiting (a second Ctrl-C), ``signum`` is sent once more.
        """
        self.signal(signum)
        deadline = time.monotonic() + timeout
        repeated = False
        while self.process.poll() is None and time.monotonic() < deadline:
            if again is not None and again.is_set() and not repeated:
                self.signal(signum)
                repeated = True
            try:
                self.process.wait(0.2)
            except subprocess.TimeoutExpired:
                continue
        if self.process.poll() is None:
            say(f"{self.name} did not stop within {timeout:.0f}s: killing it")
            self.process.kill()
            self.process.wait()
        self._pump.join(5)
        return self.process.returncode


def _echo(stream: TextIO, prefix: str) -> None:
    for line in stream:
        say(line.rstrip("\n"), prefix)


def manage(env: dict[str, str], *args: str, prefix: str, quiet: bool = False) -> str:
    """Run ``manage.py ARGS`` to completion, echoing its output; return the output.

    Raises :class:`DemoError` if it exits with a non-zero status.
    """
    result = subprocess.run(
        [sys.executable, str(MANAGE), *args],
        cwd=PROJECT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        start_new_session=True,
        check=False,
    )
    output = result.stdout + result.stderr
    if not quiet or result.returncode:
        for line in output.splitlines():
            say(line, prefix)
    if result.returncode:
        raise DemoError(f"manage.py {args[0]} exited with status {result.returncode}")
    return result.stdout


# ---------------------------------------------------------------- HTTP checks
@dataclass
class AdminCheck:
    """What logging in to the admin over HTTP showed."""

    index_status: int
    pages: dict[str, int] = field(default_factory=dict)

    @property
    def queue_pages(self) -> list[str]:
        """Return the django_pgqueue pages linked from the admin index."""
        return [page for page in self.pages if page.startswith("/admin/django_pgqueue/")]


def wait_for_http(url: str, child: Child, timeout: float, stop: threading.Event) -> None:
    """Poll ``url`` until it answers; raise :class:`DemoError` if ``child`` exits first.

    Raises :class:`Interrupted` if ``stop`` is set meanwhile.
    """
    deadline = time.monotonic() + timeout
    opener = build_opener()
    while True:
        if stop.is_set():
            raise Interrupted
        if child.exit_code() is not None:
            raise DemoError(f"the web server exited with status {child.exit_code()}")
        try:
            with opener.open(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (URLError, OSError):
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise DemoError(f"{url} did not answer within {timeout:.0f}s")
        stop.wait(0.2)


def check_admin(base_url: str, username: str, password: str) -> AdminCheck:
    """Log in through the admin's login form and open every page the index links to.

    Raises :class:`DemoError` unless the login lands on ``/admin/`` with HTTP 200 and
    every linked model page answers HTTP 200.
    """
    opener = build_opener(HTTPCookieProcessor(CookieJar()))
    login_url = f"{base_url}/admin/login/?next=/admin/"
    try:
        with opener.open(login_url, timeout=10) as response:
            form_page = response.read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form_page)
        if token is None:
            raise DemoError("the admin login page has no CSRF token")
        form = {
            "csrfmiddlewaretoken": token[1],
            "username": username,
            "password": password,
            "next": "/admin/",
        }
        request = Request(login_url, data=urlencode(form).encode(), headers={"Referer": login_url})
        with opener.open(request, timeout=10) as response:
            landed, status, index = urlparse(response.url).path, response.status, response.read()
        if landed != "/admin/" or status != 200:
            raise DemoError(f"logging in to the admin ended on {landed} with HTTP {status}")
        check = AdminCheck(index_status=status)
        links = re.findall(r'href="(/admin/[a-z_]+/[a-z_]+/)"', index.decode())
        for link in sorted(set(links)):
            with opener.open(f"{base_url}{link}", timeout=30) as response:
                check.pages[link] = response.status
    except URLError as error:
        raise DemoError(f"admin check failed: {error}") from error
    return check


def pick_port(preferred: int) -> int:
    """Return ``preferred`` if nothing listens on it, else a free port."""
    for candidate in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            # As runserver does: a port left in TIME_WAIT by the last run is free to use.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            port: int = probe.getsockname()[1]
            return port
    raise DemoError("no free TCP port on 127.0.0.1")


# ---------------------------------------------------------------- the demo
class Demo:
    """One run of the demo: set up, run, stop, summarise."""

    def __init__(self, seconds: float | None, port: int) -> None:
        self.seconds = seconds
        self.preferred_port = port
        self.stop_requested = threading.Event()
        self.stop_repeated = threading.Event()
        self.failures: list[str] = []
        self.env: dict[str, str] = {}
        self.server: EmbeddedPostgres | None = None  # set only if this run started it
        self.database = ""
        self.password = os.environ.get("DEMO_ADMIN_PASSWORD") or secrets.token_urlsafe(9)
        self.migrated = False
        self.worker: Child | None = None
        self.web: Child | None = None
        self.base_url = ""
        self.admin_check: AdminCheck | None = None
        self.worker_status: int | None = None
        self.ran_for = 0.0

    # ------------------------------------------------------------------ entry point
    def run(self) -> int:
        """Run everything; return the exit status."""
        previous = {
            signum: signal.signal(signum, self._on_signal)
            for signum in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            try:
                self._set_up()
                self._start()
                self._wait()
            except Interrupted:
                say("interrupted during set-up")
            except DemoError as error:
                self.failures.append(str(error))
                say(f"error: {error}")
            finally:
                self._stop()
            self._summarise()
        finally:
            self._stop_database()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if self.failures:
            say("FAILED: " + "; ".join(self.failures))
            return 1
        say("OK")
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only set flags: the main loop does the stopping (never inside a handler).
        if self.stop_requested.is_set():
            self.stop_repeated.set()
        self.stop_requested.set()

    def _check_interrupt(self) -> None:
        if self.stop_requested.is_set():
            raise Interrupted

    # ------------------------------------------------------------------ set-up
    def _set_up(self) -> None:
        url = self._database_url()
        self.database = describe(url)
        self.env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "shop.settings",
            "PYTHONUNBUFFERED": "1",
        }
        try:
            created = ensure_database(url)
        except psycopg.Error as error:
            raise DemoError(f"cannot reach PostgreSQL ({self.database}): {error}") from error
        say(f"{self.database}: {'created' if created else 'exists, reused'}")
        self._check_interrupt()

        say("applying migrations")
        manage(self.env, "migrate", "--noinput", prefix="migrate")
        self.migrated = True
        self._check_interrupt()

        manage(
            {**self.env, "DJANGO_SUPERUSER_PASSWORD": self.password},
            "ensure_admin",
            ADMIN_USERNAME,
            prefix="admin",
        )
        say(f"admin login: username {ADMIN_USERNAME!r}, password {self.password!r}")
        self._check_interrupt()

        say("seeding a fresh batch of orders and jobs")
        manage(self.env, "seed_demo", prefix="seed")
        self._check_interrupt()

    def _database_url(self) -> str:
        configured = os.environ.get("DATABASE_URL")
        if configured:
            say(f"PostgreSQL: DATABASE_URL ({describe(configured)})")
            return configured
        try:
            server = EmbeddedPostgres(EMBEDDED_ROOT)
            say(f"starting the embedded PostgreSQL {server.major} in {EMBEDDED_ROOT}")
            if server.start():
                self.server = server
                say("embedded PostgreSQL started; the demo stops it when it exits")
            else:
                say("embedded PostgreSQL was already running; the demo leaves it running")
        except EmbeddedPostgresError as error:
            raise DemoError(str(error)) from error
        return server.url(DEMO_DATABASE)

    # ------------------------------------------------------------------ running
    def _start(self) -> None:
        say("starting the worker: manage.py runqueueworker")
        self.worker = Child("worker", ["runqueueworker"], self.env)

        port = pick_port(self.preferred_port)
        self.base_url = f"http://127.0.0.1:{port}"
        say(f"starting the web server: manage.py runserver 127.0.0.1:{port}")
        self.web = Child("web", ["runserver", f"127.0.0.1:{port}", "--noreload"], self.env)
        wait_for_http(
            f"{self.base_url}/admin/login/", self.web, STARTUP_TIMEOUT, self.stop_requested
        )
        self.admin_check = check_admin(self.base_url, ADMIN_USERNAME, self.password)
        say(
            f"logged in to the admin over HTTP: /admin/ answered HTTP "
            f"{self.admin_check.index_status}, {len(self.admin_check.pages)} admin pages too"
        )
        self._print_guide()

    def _print_guide(self) -> None:
        queue_pages = self.admin_check.queue_pages if self.admin_check else []
        lines = [
            "",
            f"The shop:  {self.base_url}/   (place an order; try the declined card)",
            f"The admin: {self.base_url}/admin/   "
            f"username {ADMIN_USERNAME!r}, password {self.password!r}",
            "",
            "What to look at:",
        ]
        lines += [
            f"  {self.base_url}{page}  {QUEUE_PAGE_NOTES.get(page, '')}".rstrip()
            for page in queue_pages
        ] or ["  (this checkout's django_pgqueue registers no admin pages yet)"]
        lines += [
            f"  {self.base_url}/admin/orders/loyaltyentry/  points applied in order per "
            "customer (partition keys)",
            f"  {self.base_url}/admin/orders/statement/  the multi-step job: rendered once, "
            "resumed after a failed upload",
            f"  {self.base_url}/admin/orders/order/  one order submitted twice, one receipt "
            "(idempotency key)",
            f"  {self.base_url}/admin/orders/dailyreport/  the scheduled report, due 15s "
            "after seeding",
            "",
            f"Stopping in {self.seconds:.0f}s."
            if self.seconds is not None
            else "Press Ctrl-C to stop (the worker drains first).",
            "",
        ]
        with _print_lock:
            print("\n".join(lines), flush=True)

    def _wait(self) -> None:
        started = time.monotonic()
        deadline = None if self.seconds is None else started + self.seconds
        try:
            while not self.stop_requested.is_set():
                if deadline is not None and time.monotonic() >= deadline:
                    break
                for child in (self.worker, self.web):
                    if child is not None and child.exit_code() is not None:
                        raise DemoError(
                            f"the {child.name} exited unexpectedly with status {child.exit_code()}"
                        )
                self.stop_requested.wait(0.5)
        finally:
            self.ran_for = time.monotonic() - started
        if self.seconds is not None and not self.stop_requested.is_set():
            # Once more, now that the jobs have run: the queue's pages with real data.
            self.admin_check = check_admin(self.base_url, ADMIN_USERNAME, self.password)

    # ------------------------------------------------------------------ stopping
    def _stop(self) -> None:
        say("stopping")
        if self.worker is not None:
            say("sending SIGTERM to the worker; it finishes its running jobs first")
            self.worker_status = self.worker.stop(
                signal.SIGTERM, WORKER_STOP_TIMEOUT, again=self.stop_repeated
            )
            if self.worker_status != 0:
                self.failures.append(f"the worker exited with status {self.worker_status}")
        if self.web is not None:
            self.web.stop(signal.SIGINT, 10.0)
            say("web server stopped")

    def _stop_database(self) -> None:
        if self.server is not None:
            self.server.stop()
            say("embedded PostgreSQL stopped")

    def _summarise(self) -> None:
        summary: dict[str, Any] | None = None
        if self.migrated:
            try:
                summary = json.loads(
                    manage(self.env, "queue_summary", "--json", prefix="summary", quiet=True)
                )
            except DemoError as error:
                self.failures.append(str(error))
        lines = [f"summary after {self.ran_for:.0f}s:"]
        if self.base_url:
            lines.append(f"  served:       {self.base_url}/admin/ (the shop at {self.base_url}/)")
        if self.admin_check is not None:
            lines.append(
                f"  admin login:  as {ADMIN_USERNAME!r}: the admin page answered HTTP "
                f"{self.admin_check.index_status}; {len(self.admin_check.pages)} admin pages "
                f"answered HTTP 200 ({len(self.admin_check.queue_pages)} of django_pgqueue)"
            )
        if summary is not None:
            jobs = summary["jobs"]
            lines.append(
                "  jobs:         "
                + ", ".join(f"{count} {status}" for status, count in jobs.items())
            )
            lines.append(
                f"                ({summary['scheduled']} pending are scheduled for later)"
            )
            dead = Counter(entry["task"] for entry in summary["dead_letters"])
            detail = ", ".join(f"{task} x{count}" for task, count in sorted(dead.items()))
            lines.append(
                f"  dead letters: {len(summary['dead_letters'])}" + (f" ({detail})" if dead else "")
            )
            lines.append(
                f"  orders:       {summary['orders']} ({summary['double_submits']} submitted "
                f"twice), receipts sent {summary['receipts_sent']}, invoices "
                f"{summary['invoices']}"
            )
            lines.append(
                f"  loyalty:      {summary['loyalty_entries']} entries, applied in order: "
                f"{'yes' if summary['loyalty_in_order'] else 'NO'}"
            )
            lines.append(
                f"  statements:   {summary['statements_delivered']} delivered, "
                f"{summary['statements_rendered_once']} rendered once (resumed after the "
                "failed upload)"
            )
            lines.append(
                f"  other jobs:   {summary['analytics_events']} analytics events (async), "
                f"{summary['daily_reports']} daily report(s) (scheduled)"
            )
        if self.worker_status is not None:
            lines.append(f"  worker:       drained on SIGTERM, exit status {self.worker_status}")
        if self.database:
            lines.append(f"  database:     {self.database}")
        for line in lines:
            say(line)


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run the demo."""
    parser = argparse.ArgumentParser(
        prog="python example_project/demo.py",
        description="Run the example shop: PostgreSQL, a queue worker and the admin.",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        help="Run this long, print a summary and exit (0 if everything worked).",
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="Web server port (default 8000, or a free one)."
    )
    options = parser.parse_args(argv)
    if options.seconds is not None and options.seconds <= 0:
        parser.error("--seconds must be positive")
    return Demo(options.seconds, options.port).run()


if __name__ == "__main__":
    sys.exit(main())
