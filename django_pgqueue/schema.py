"""Import path of the migration operations the migrations name (they are never edited).

The code lives in :mod:`django_pgqueue.store.schema`; this module only re-exports it.
"""

from django_pgqueue.store.schema import EnsureIndexConcurrently, RemoveIndexConcurrentlyExactly

__all__ = ["EnsureIndexConcurrently", "RemoveIndexConcurrentlyExactly"]
