"""The store: the SQL files, the statements that run them, and their typed values.

The only layer that executes queue SQL. Beneath it: the settings, errors and states at the
package root; above it: the models, the task API, the features, the worker and the admin.
See docs/explanation/architecture.md.
"""
