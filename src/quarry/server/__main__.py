"""``python -m quarry.server serve --data DIR --drives FILE ...``: one storage server process.

``--drives`` names a JSON file listing the drives it fronts, as a cluster file lists devices
(name, address, and the token and CA files to call them with).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from quarry.errors import QuarryError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quarry.server")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run one storage server in front of its drives")
    serve.add_argument("--data", required=True)
    serve.add_argument("--drives", required=True, help="JSON file: the drives it fronts")
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--profile", default="host")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--name")
    serve.add_argument("--ready-file")
    serve.add_argument("--profiles")
    serve.add_argument("--credentials")
    serve.add_argument("--tls", action="store_true")
    serve.add_argument("--insecure", action="store_true")
    options = parser.parse_args(argv)
    import logging

    from quarry.device.profile import get_profile
    from quarry.device.server import security_of
    from quarry.server.service import serve as run

    try:
        drives = json.loads(Path(options.drives).read_text())
        security = security_of(options.credentials, options.tls, options.insecure)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        run(
            options.data,
            get_profile(options.profile, options.profiles),
            drives,
            options.host,
            options.port,
            options.name,
            options.ready_file,
            security,
        )
    except QuarryError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
