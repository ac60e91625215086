"""Sphinx configuration for the django-pgqueue documentation."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent / "_ext"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "docs.settings")

import django  # noqa: E402 - after the path and settings are set up

django.setup()

project = "django-pgqueue"
author = "django-pgqueue maintainers"
copyright = "2026, django-pgqueue maintainers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
    "pgqueue_docs",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "settings.py", "_inventories"]

html_theme = "furo"
html_title = "django-pgqueue"

# No network at build time: the inventories are files kept in the repository.
intersphinx_mapping = {
    "django": (
        "https://docs.djangoproject.com/en/6.1/",
        str(Path(__file__).parent / "_inventories" / "django.inv"),
    ),
}
intersphinx_disabled_reftypes = ["*"]
nitpicky = False
