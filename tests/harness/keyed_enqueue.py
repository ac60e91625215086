"""Enqueue rates of keyed jobs, for comparing two releases side by side (run by hand).

Each round migrates nothing: the database is made once per code tree (``--setup``),
then every round times, on Django's connection as an application does, single enqueues
of: plain jobs, jobs with a new idempotency key each, coalesced jobs with a new key each
(a new holder every time) and coalesced jobs sharing one key (the holder updated), each
outside a transaction (autocommit) and inside ``transaction.atomic()`` (100 per
transaction). Prints one line: jobs/s of each kind.

usage: keyed_enqueue.py DSN DBNAME [--setup] [--count N] [--kinds K,K] [--code PATH]
  DSN: postgres://user@host:port/ (the database DBNAME on it is used, made by --setup)
  --code: the checkout whose django_pgqueue is timed (default: this one)
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("dsn")
ap.add_argument("dbname")
ap.add_argument("--setup", action="store_true")
ap.add_argument("--count", type=int, default=2000)
ap.add_argument("--kinds", default="")
ap.add_argument("--code", default=str(Path(__file__).resolve().parents[2]))
o = ap.parse_args()
sys.path.insert(0, o.code)

import psycopg  # noqa: E402

if o.setup:
    with psycopg.connect(o.dsn + "postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{o.dbname}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{o.dbname}"')

import django  # noqa: E402
from django.conf import settings  # noqa: E402

conninfo = psycopg.conninfo.conninfo_to_dict(o.dsn + o.dbname)
settings.configure(
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": o.dbname,
            "USER": conninfo.get("user", "postgres"),
            "HOST": conninfo.get("host", "127.0.0.1"),
            "PORT": conninfo.get("port", "5432"),
        }
    },
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_pgqueue"],
    USE_TZ=True,
    PGQUEUE_QUEUES=["default"],
)
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

import django_pgqueue  # noqa: E402
from django_pgqueue.models import Job  # noqa: E402
from django_pgqueue.store.values import JobSpec  # noqa: E402

print(f"# code: {django_pgqueue.__file__}", flush=True)
if o.setup:
    call_command("migrate", verbosity=0)
    sys.exit(0)

store = Job.objects.store()
tag = uuid.uuid4().hex[:8]
KINDS = {
    "plain": lambda i: JobSpec("bench.noop", args=[i]),
    "idempotent, new key": lambda i: JobSpec("bench.noop", idempotency_key=f"{tag}-i-{i}"),
    "coalesced, new key": lambda i: JobSpec("bench.noop", args=[i], coalesce_key=f"{tag}-c-{i}"),
    "coalesced, one key": lambda i: JobSpec("bench.noop", args=[i], coalesce_key=f"{tag}-one"),
}


def timed(make, *, atomic: bool) -> float:
    started = time.perf_counter()
    if atomic:
        for first in range(0, o.count, 100):
            with transaction.atomic():
                for i in range(first, min(first + 100, o.count)):
                    store.enqueue(make(i))
    else:
        for i in range(o.count):
            store.enqueue(make(i))
    return o.count / (time.perf_counter() - started)


results = []
for name, make in KINDS.items():
    if o.kinds and name not in o.kinds.split(","):
        continue
    for atomic in (False, True):
        results.append(
            f"{name} {'atomic' if atomic else 'autocommit'}={timed(make, atomic=atomic):.0f}"
        )
        tag = uuid.uuid4().hex[:8]
print("; ".join(results), flush=True)
with connection.cursor() as cursor:
    cursor.execute("DELETE FROM django_pgqueue_job")
