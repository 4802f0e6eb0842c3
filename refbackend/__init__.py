"""The reference backend: a small, honest stand-in for the real run queue.

A real HTTP server (stdlib ThreadingHTTPServer) over a real database
(SQLite). It implements the part of the backend the dispatcher talks to,
for local runs, the demo and the tests; it is not the product's backend.
See docs/dispatcher.md for the endpoints.
"""
