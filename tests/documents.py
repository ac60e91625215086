"""Run the README's quick start and the tutorial as a reader would, from the documents.

A fenced block preceded by a marker comment is a step; unmarked blocks are prose::

    <!-- docs-test: file shop/models.py -->     write the block to that file
    <!-- docs-test: append mysite/settings.py -->  add the block at the end of that file
    <!-- docs-test: run -->                    run each command line of the block
    <!-- docs-test: shell -->                  run the block in the project's Django shell
    <!-- docs-test: session -->                a ``>>>`` shell session, checked as a doctest

Shell code and sessions share one ``manage.py shell`` process, so a session can go on
after a worker ran. In ``run`` blocks, ``pip install`` lines are checked (they must
name the distribution) rather than run, ``python`` and ``django-admin`` are this
interpreter, and ``runqueueworker`` gets ``--burst``, so it exits once the jobs are done.
"""

from __future__ import annotations

import doctest
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

DISTRIBUTION = "django-tasks-pgqueue"
_MARKER = re.compile(r"^<!-- docs-test: (file|append|run|shell|session)(?: (\S+))? -->$")
_FENCE = re.compile(r"^(`{3,}|~{3,})")
_STEP_TIMEOUT = 90


@dataclass(frozen=True)
class Step:
    """One marked block of a document."""

    action: str
    target: str | None
    text: str
    source: str


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


def run_steps(steps: list[Step], project: Path, env: dict[str, str]) -> None:
    """Run ``steps`` in ``project``; hand over to one Django shell at the first shell step."""
    for position, step in enumerate(steps):
        if step.action in {"shell", "session"}:
            _run_in_shell(steps[position:], project, env)
            return
        _run_step(step, project, env, namespace=None)


def _run_in_shell(steps: list[Step], project: Path, env: dict[str, str]) -> None:
    plan = project / ".docs-test-steps.json"
    plan.write_text(json.dumps([asdict(step) for step in steps]))
    code = "from tests.documents import continue_in_shell; continue_in_shell()"
    _check_call([sys.executable, "manage.py", "shell", "-c", code], project, env, steps[0])


def continue_in_shell() -> None:
    """Run the rest of the plan inside ``manage.py shell`` (called by :func:`run_steps`)."""
    project = Path.cwd()
    steps = [Step(**item) for item in json.loads((project / ".docs-test-steps.json").read_text())]
    namespace: dict[str, object] = {"__name__": "__docs_test__"}
    for step in steps:
        _run_step(step, project, dict(os.environ), namespace=namespace)


def _run_step(
    step: Step, project: Path, env: dict[str, str], namespace: dict[str, object] | None
) -> None:
    if step.action in {"file", "append"}:
        assert step.target, f"{step.source}: {step.action} needs a path"
        target = project / step.target
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("w" if step.action == "file" else "a") as handle:
            handle.write(("\n" if step.action == "append" else "") + step.text)
        if target.suffix == ".py":
            compile(target.read_text(), str(target), "exec")
    elif step.action == "run":
        for line in step.text.splitlines():
            command = shlex.split(line, comments=True)
            if command:
                _run_command(command, step, project, env)
    elif step.action == "shell":
        assert namespace is not None
        exec(compile(step.text, step.source, "exec"), namespace)
    elif step.action == "session":
        assert namespace is not None
        _run_session(step, namespace)


def _run_command(command: list[str], step: Step, project: Path, env: dict[str, str]) -> None:
    if command[:2] == ["pip", "install"]:
        assert any(arg.startswith(f"{DISTRIBUTION}[") or arg == DISTRIBUTION for arg in command), (
            f"{step.source}: {shlex.join(command)} does not install {DISTRIBUTION}"
        )
        return
    if command[0] == "python":
        command = [sys.executable, *command[1:]]
    elif command[0] == "django-admin":
        command = [sys.executable, "-m", "django", *command[1:]]
    else:
        raise AssertionError(f"{step.source}: unexpected command {shlex.join(command)}")
    if "runqueueworker" in command and "--burst" not in command:
        command.append("--burst")
    _check_call(command, project, env, step)


def _run_session(step: Step, namespace: dict[str, object]) -> None:
    parser = doctest.DocTestParser()
    test = parser.get_doctest(step.text, namespace, step.source, step.source, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test, clear_globs=False)
    namespace.update(test.globs)  # DocTest works on a copy: carry the names forward
    assert runner.failures == 0, f"{step.source}: the session's output differs (see above)"


def _check_call(command: list[str], project: Path, env: dict[str, str], step: Step) -> None:
    completed = subprocess.run(
        command,
        cwd=project,
        env=env,
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
