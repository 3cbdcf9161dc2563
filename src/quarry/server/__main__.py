"""``python -m quarry.server serve --data DIR --drives FILE ...``: one storage server process.

``--drives`` names a JSON file listing the drives it fronts, as a cluster file lists devices
(name, address, and the token and CA files to call them with).
"""

from __future__ import annotations

import argparse
import sys

from quarry.device.__main__ import exit_with, serve_options
from quarry.errors import QuarryError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quarry.server")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = serve_options(
        commands.add_parser("serve", help="run one storage server in front of its drives")
    )
    serve.add_argument("--drives", required=True, help="JSON file: the drives it fronts")
    options = parser.parse_args(argv)
    exit_with(options.exit_with)
    import logging

    from quarry.coordinator.membership.cluster_file import read_drives
    from quarry.device.profile import get_profile
    from quarry.device.server import enrolled_name, security_of
    from quarry.server.service import serve as run

    try:
        drives = read_drives(options.drives)
        security = security_of(
            options.credentials, options.tls, options.insecure, options.data, options.verify_clients
        )
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        run(
            options.data,
            get_profile(options.profile, options.profiles),
            drives,
            options.host,
            options.port,
            enrolled_name(security, options.name),
            options.ready_file,
            security,
            options.metrics_port,
        )
    except QuarryError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
