"""The project's tests, grouped by behaviour."""
