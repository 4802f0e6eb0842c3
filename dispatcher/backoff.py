"""Temporary re-export (remove once dispatcher/app.py and watcher.py import toolkit.backoff): the core's backoff."""
from toolkit.backoff import Backoff as Backoff  # noqa: F401
