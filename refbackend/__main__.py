"""`python -m refbackend --db PATH [--host H] [--port P] [--lease S] [--timeout S] [--faults]`.

The service token comes from TCAB_BACKEND_SERVICE_TOKEN.

Prints one line `listening on http://HOST:PORT` on stdout when ready.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from refbackend import server, store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refbackend", description="The reference backend (a stand-in).")
    parser.add_argument("--db", required=True, help="SQLite database file (created if missing)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--lease", type=float, default=300.0,
                        help="seconds before a claimed run that never started is offered again (default 300)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="socket timeout in seconds: a client silent that long mid-request is cut off (default 30)")
    parser.add_argument("--faults", action="store_true",
                        help="serve the fault-injection test hooks POST/GET /_faults (off by default: tests only)")
    args = parser.parse_args(argv)
    if not 0 < args.timeout <= 3600:
        parser.error(f"--timeout {args.timeout:g} is outside 0..3600 seconds")
    if not 0 < args.lease <= 86400 * 30:
        parser.error(f"--lease {args.lease:g} is outside 0..2592000 seconds")
    token = os.environ.get("TCAB_BACKEND_SERVICE_TOKEN", "")
    if not token:
        print("refbackend: TCAB_BACKEND_SERVICE_TOKEN is required and not set", file=sys.stderr)
        return 2
    httpd = server.Server((args.host, args.port), db=store.Store(args.db, lease_seconds=args.lease),
                          service_token=token, faults=args.faults, timeout=args.timeout)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    host, port = httpd.server_address[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
