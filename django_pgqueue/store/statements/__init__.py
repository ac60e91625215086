"""The queue store's statements, one module per ``sql/*.sql`` file."""
