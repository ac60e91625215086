"""Documented import path of the embedded PostgreSQL (``database_settings`` in settings).

The code lives in :mod:`django_pgqueue.tools.embedded`; this module only re-exports it.
"""

from django_pgqueue.tools.embedded import (
    EmbeddedPostgres,
    EmbeddedPostgresError,
    database_settings,
    main,
)

__all__ = ["EmbeddedPostgres", "EmbeddedPostgresError", "database_settings"]

if __name__ == "__main__":  # ``python -m django_pgqueue.embedded``, as before the move
    raise SystemExit(main())
