"""The example shop's project package: settings, URLs, WSGI and database selection."""
