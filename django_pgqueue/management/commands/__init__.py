"""The commands themselves, each a thin shell over the package (see ``manage.py help``)."""
