"""Run the README's quick start and the tutorial as a reader would, from the documents.

A fenced block preceded by a marker comment is a step; unmarked blocks are prose::

    <!-- docs-test: file shop/models.py -->     write the block to that file
    <!-- docs-test: append mysite/settings.py -->  add the block at the end of that file
    <!-- docs-test: run -->                    run each command line of the block
    <!-- docs-test: background -->             start each command line and leave it running
    <!-- docs-test: shell -->                  run the block in the project's Django shell
    <!-- docs-test: session -->                a ``>>>`` shell session, checked as a doctest

Commands run as written. ``python`` and ``django-admin`` are the interpreter given to
:func:`run_steps` (the project's), ``createdb`` is PostgreSQL's client from ``PATH``, and
``pip install`` lines are checked (they must name the distribution) rather than run.
``createsuperuser`` gets a terminal of its own and the answers a reader would type. A
``background`` command is what a reader leaves running in another terminal (the worker,
``runserver``): the next step waits until it is ready, and at the end it gets Ctrl-C
(SIGINT to its process group) and must exit with 0.

Shell code and sessions share one ``manage.py shell`` process, so a session can go on
after a worker ran. This module imports only the standard library: the shell loads it by
path, so a project on an installed wheel does not see the repository's packages.
"""

from __future__ import annotations

import contextlib
import doctest
import fcntl
import json
import os
import pty
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

DISTRIBUTION = "django-tasks-pgqueue"
_MARKER = re.compile(r"^<!-- docs-test: (file|append|run|background|shell|session)(?: (\S+))? -->$")
_FENCE = re.compile(r"^(`{3,}|~{3,})")
_STEP_TIMEOUT = 90
#: What a reader answers ``createsuperuser`` (a password Django's validators accept).
SUPERUSER = {"username": "admin", "email": "admin@example.com", "password": "c0rrect-h0rse-42"}
_PROMPTS = (
    ("Username", SUPERUSER["username"]),
    ("Email address", SUPERUSER["email"]),
    ("Password (again)", SUPERUSER["password"]),
    ("Password", SUPERUSER["password"]),
)
#: The address ``runserver`` serves without arguments.
RUNSERVER_URL = "http://127.0.0.1:8000"
#: Held while a test may serve on that address, so that test runs side by side (CI's
#: legs) take turns with it rather than one's checks reaching the other's server.
RUNSERVER_LOCK = Path("/tmp/django-pgqueue-tests-runserver-8000.lock")


@dataclass(frozen=True)
class Step:
    """One marked block of a document."""

    action: str
    target: str | None
    text: str
    source: str


@dataclass
class _Background:
    """A command left running, with its output in a file."""

    command: list[str]
    source: str
    process: subprocess.Popen[bytes]
    log: Path

    def read(self) -> str:
        return self.log.read_text(errors="replace")


def extract(path: Path) -> list[Step]:
    """Return the marked blocks of the Markdown file at ``path``, in order."""
    lines = path.read_text().splitlines()
    steps: list[Step] = []
    index = 0
    while index < len(lines):
        marker = _MARKER.match(lines[index].strip())
        index += 1
        if not marker:
            continue
        while index < len(lines) and not lines[index].strip():
            index += 1
        fence = _FENCE.match(lines[index]) if index < len(lines) else None
        if fence is None:
            raise ValueError(f"{path.name}:{index}: a docs-test marker must precede a fence")
        start = index + 1
        index = start
        while not lines[index].startswith(fence.group(1)):
            index += 1
        text = "\n".join(lines[start:index]) + "\n"
        steps.append(Step(marker.group(1), marker.group(2), text, f"{path.name}:{start}"))
        index += 1
    return steps


def run_steps(
    steps: list[Step], project: Path, env: dict[str, str], *, python: str = sys.executable
) -> None:
    """Run ``steps`` in ``project`` with ``python``; hand over to one Django shell at the
    first shell step. Commands left running are stopped (Ctrl-C) at the end."""
    runner = _Runner(project, env, python)
    with _ctrl_c_as_from_a_terminal():
        try:
            for position, step in enumerate(steps):
                if step.action in {"shell", "session"}:
                    runner.hand_over(steps[position:])
                    return
                runner.run(step, namespace=None)
        finally:
            runner.stop_background()


def continue_in_shell() -> None:
    """Run the rest of the plan inside ``manage.py shell`` (called by :func:`run_steps`)."""
    project = Path.cwd()
    steps = [Step(**item) for item in json.loads((project / ".docs-test-steps.json").read_text())]
    namespace: dict[str, object] = {"__name__": "__docs_test__"}
    runner = _Runner(project, dict(os.environ), sys.executable)
    with _ctrl_c_as_from_a_terminal():
        try:
            for step in steps:
                runner.run(step, namespace=namespace)
        finally:
            runner.stop_background()


@contextlib.contextmanager
def _ctrl_c_as_from_a_terminal() -> Iterator[None]:
    """Let the commands started here get Ctrl-C as from a reader's terminal.

    A shell without job control starts a background job (``make test &``, a CI leg run
    beside another) with SIGINT and SIGQUIT ignored. Every process it starts inherits
    that, and Python keeps an inherited SIG_IGN, so ``runserver`` would ignore Ctrl-C.
    A handled signal is reset to the default in a new program, an ignored one is not.
    """
    previous = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGQUIT)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    try:
        yield
    finally:
        for number, handler in previous.items():
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(number, handler)


class _Runner:
    def __init__(self, project: Path, env: dict[str, str], python: str) -> None:
        self.project = project
        self.env = env
        self.python = python
        self.background: list[_Background] = []
        self.held: list[contextlib.ExitStack] = []

    def hand_over(self, steps: list[Step]) -> None:
        plan = self.project / ".docs-test-steps.json"
        plan.write_text(json.dumps([asdict(step) for step in steps]))
        # By path: the project's interpreter may not have this repository on its path
        # (registered in sys.modules, as dataclasses need).
        here = str(Path(__file__).resolve())
        code = (
            "import importlib.util, sys; "
            f"spec = importlib.util.spec_from_file_location('docs_test', {here!r}); "
            "module = sys.modules['docs_test'] = importlib.util.module_from_spec(spec); "
            "spec.loader.exec_module(module); module.continue_in_shell()"
        )
        self.check_call([self.python, "manage.py", "shell", "-c", code], steps[0])

    def run(self, step: Step, namespace: dict[str, object] | None) -> None:
        if step.action in {"file", "append"}:
            assert step.target, f"{step.source}: {step.action} needs a path"
            target = self.project / step.target
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("w" if step.action == "file" else "a") as handle:
                handle.write(("\n" if step.action == "append" else "") + step.text)
            if target.suffix == ".py":
                compile(target.read_text(), str(target), "exec")
        elif step.action in {"run", "background"}:
            for line in step.text.splitlines():
                command = shlex.split(line, comments=True)
                if command:
                    self.command(command, step)
        elif step.action == "shell":
            assert namespace is not None
            exec(compile(step.text, step.source, "exec"), namespace)
        elif step.action == "session":
            assert namespace is not None
            _run_session(step, namespace)

    def command(self, command: list[str], step: Step) -> None:
        if command[:2] == ["pip", "install"]:
            assert any(
                arg.startswith(f"{DISTRIBUTION}[") or arg == DISTRIBUTION for arg in command
            ), f"{step.source}: {shlex.join(command)} does not install {DISTRIBUTION}"
            return
        if command[0] == "python":
            command = [self.python, *command[1:]]
        elif command[0] == "django-admin":
            command = [self.python, "-m", "django", *command[1:]]
        elif command[0] != "createdb":
            raise AssertionError(f"{step.source}: unexpected command {shlex.join(command)}")
        if step.action == "background":
            self.start(command, step)
        elif "createsuperuser" in command:
            self.answer(command, step)
        else:
            self.check_call(command, step)

    def check_call(self, command: list[str], step: Step) -> None:
        completed = subprocess.run(
            command,
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=_STEP_TIMEOUT,
            check=False,
        )
        print(completed.stdout, completed.stderr, sep="", end="")  # shown when a test fails
        assert completed.returncode == 0, (
            f"{step.source}: {shlex.join(command)} exited with {completed.returncode}\n"
            f"{completed.stdout}{completed.stderr}"
        )

    def answer(self, command: list[str], step: Step) -> None:
        """Run an interactive command in a terminal of its own, answering its prompts."""
        main, follower = pty.openpty()
        # A session of its own: no controlling terminal, so getpass reads the pty too.
        process = subprocess.Popen(
            command,
            cwd=self.project,
            env=self.env,
            stdin=follower,
            stdout=follower,
            stderr=follower,
            start_new_session=True,
        )
        os.close(follower)
        transcript, line = "", ""
        deadline = time.monotonic() + _STEP_TIMEOUT
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([main], [], [], 0.2)
                if not ready:
                    if process.poll() is not None:
                        break
                    continue
                try:
                    chunk = os.read(main, 4096).decode(errors="replace")
                except OSError:  # the command closed its terminal
                    break
                if not chunk:
                    break
                transcript += chunk
                line = (line + chunk).rsplit("\n", 1)[-1]
                for prompt, reply in _PROMPTS:
                    if line.lstrip().startswith(prompt) and line.rstrip().endswith(":"):
                        os.write(main, f"{reply}\n".encode())
                        line = ""
                        break
            code = process.wait(timeout=max(deadline - time.monotonic(), 1))
        finally:
            os.close(main)
            if process.poll() is None:
                process.kill()
                process.wait()
        print(transcript)
        assert code == 0, f"{step.source}: {shlex.join(command)} exited with {code}\n{transcript}"

    def start(self, command: list[str], step: Step) -> None:
        """Start ``command`` in the background and wait until it is ready."""
        if command[1:] == ["manage.py", "runserver"]:
            self.held.append(_runserver_address(step))
        # Kept in the project, where a test can read what the command printed.
        name = next((word for word in command[1:] if word.isidentifier()), "command")
        log = self.project / f".docs-test-{name}-{len(self.background)}.log"
        with log.open("wb") as handle:
            process = subprocess.Popen(
                command,
                cwd=self.project,
                # faulthandler prints every thread's stack on SIGABRT, which a command
                # that does not stop on Ctrl-C gets before it is killed (below).
                env={**self.env, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"},
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        running = _Background(command, step.source, process, log)
        self.background.append(running)
        ready = _ready_check(command)
        deadline = time.monotonic() + _STEP_TIMEOUT
        while not ready(running):
            assert process.poll() is None, (
                f"{step.source}: {shlex.join(command)} exited with {process.returncode}\n"
                f"{running.read()}"
            )
            assert time.monotonic() < deadline, (
                f"{step.source}: {shlex.join(command)} was not ready after {_STEP_TIMEOUT}s\n"
                f"{running.read()}"
            )
            time.sleep(0.1)

    def stop_background(self) -> None:
        """Press Ctrl-C in each background command's terminal; each must exit with 0."""
        problems = []
        for running in reversed(self.background):
            if running.process.poll() is None:
                os.killpg(running.process.pid, signal.SIGINT)
            try:
                code = running.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                state = _group_state(running.process.pid)
                # The stacks, so that a command stuck in its exit shows where.
                os.killpg(running.process.pid, signal.SIGABRT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    running.process.wait(timeout=10)
                _kill_group(running.process.pid)
                code = running.process.wait()
                problems.append(f"{shlex.join(running.command)} did not stop on Ctrl-C:\n{state}")
            output = running.read()
            print(f"--- {shlex.join(running.command)} ({running.source}) ---\n{output}")
            if code != 0:
                problems.append(f"{shlex.join(running.command)} exited with {code}:\n{output}")
        self.background.clear()
        for held in self.held:
            held.close()
        self.held.clear()
        assert not problems, "\n".join(problems)


def runserver_turn(lock: Path = RUNSERVER_LOCK, source: str = "a test") -> contextlib.ExitStack:
    """Take the turn with ``runserver``'s default address (held until the stack closes).

    Every test that may serve on it takes the turn: the documents' ``runserver`` and the
    example project's demo (which takes 8000 when it is free), so that test runs side by
    side never reach each other's server.
    """
    held = contextlib.ExitStack()
    handle = held.enter_context(lock.open("a"))
    deadline = time.monotonic() + 2 * _STEP_TIMEOUT
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return held
        except BlockingIOError:
            if time.monotonic() > deadline:
                held.close()
                raise AssertionError(
                    f"{source}: another test run held {lock} for {2 * _STEP_TIMEOUT}s"
                ) from None
            time.sleep(0.2)


def _runserver_address(
    step: Step, port: int = 8000, lock: Path = RUNSERVER_LOCK
) -> contextlib.ExitStack:
    """Take the turn with ``runserver``'s address, and check that nothing else has it."""
    held = runserver_turn(lock, step.source)
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            held.close()
            raise AssertionError(
                f"{step.source}: 127.0.0.1:{port} is taken by a process outside the tests "
                f"({error}); runserver would fail and the checks reach that one"
            ) from None
    return held


def _group_processes(group: int) -> list[Path]:
    """The ``/proc`` entries of the processes in process group ``group``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            # The command name, in parentheses, may hold spaces: the fields follow it.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group:
            found.append(entry)
    return found


def _group_state(group: int) -> str:
    """Each process of the group with its threads' states and kernel wait channels."""
    lines = []
    for entry in _group_processes(group):
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = dict(
                line.split(":\t", 1)
                for line in (entry / "status").read_text().splitlines()
                if ":\t" in line
            )
            lines.append(f"pid {entry.name} ppid {status.get('PPid')}: {command.strip()}")
            for key in ("State", "SigBlk", "SigIgn", "SigCgt"):
                lines.append(f"  {key}: {status.get(key, '?').strip()}")
            for thread in sorted((entry / "task").iterdir(), key=lambda path: int(path.name)):
                name = (thread / "comm").read_text().strip()
                wchan = (thread / "wchan").read_text().strip()
                stat = (thread / "stat").read_text().rsplit(")", 1)[1].split()[0]
                lines.append(f"  thread {thread.name} {name!r}: {stat} in {wchan or '-'}")
        except OSError as error:
            lines.append(f"pid {entry.name}: {error}")
    return "\n".join(lines) or f"no process left in group {group}"


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def _ready_check(command: list[str]) -> Callable[[_Background], bool]:
    """Return a test of whether a background command is ready for the next step."""
    if "runserver" in command:

        def serving(_running: _Background) -> bool:
            try:
                with urllib.request.urlopen(f"{RUNSERVER_URL}/admin/login/", timeout=5) as page:
                    return page.status == 200 and b"Django" in page.read()
            except (urllib.error.URLError, OSError):
                return False

        return serving
    if "runqueueworker" in command:
        return lambda running: "started: queues=" in running.read()
    return lambda _running: True


def _run_session(step: Step, namespace: dict[str, object]) -> None:
    parser = doctest.DocTestParser()
    test = parser.get_doctest(step.text, namespace, step.source, step.source, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test, clear_globs=False)
    namespace.update(test.globs)  # DocTest works on a copy: carry the names forward
    assert runner.failures == 0, f"{step.source}: the session's output differs (see above)"
