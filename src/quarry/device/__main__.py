"""``python -m quarry.device serve --data DIR ...``: a device process, without the CLI.

The same options as ``quarry device serve``; this entry imports only what a device needs (no
coordinator, no DataFusion until a sub-plan comes), so many devices fit on one machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from quarry.errors import QuarryError


def serve_options(serve: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options every server process takes (a device's, a storage server's)."""
    serve.add_argument("--data", required=True)
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--profile", default="host")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--name")
    serve.add_argument("--ready-file")
    serve.add_argument("--profiles")
    serve.add_argument("--credentials")
    serve.add_argument("--tls", action="store_true")
    serve.add_argument("--insecure", action="store_true")
    serve.add_argument("--verify-clients", action="store_true")
    # its failure domain: the host it runs on (default: this machine's name) and its rack
    serve.add_argument("--host-label")
    serve.add_argument("--rack")
    # Prometheus metrics on this port, on the same address (docs/operations.md)
    serve.add_argument("--metrics-port", type=int)
    # the process that started it (a local cluster's): it exits once that one is gone
    serve.add_argument("--exit-with", type=int)
    return serve


PARENT_CHECK_S = 0.5
PR_SET_THP_DISABLE = 41  # linux/prctl.h


def without_huge_pages() -> None:
    """Ask Linux for no transparent huge pages in this process. Its allocators map memory in
    regions they mark for huge pages, and a request's buffers live milliseconds: each first
    touch of a fresh region zeroed 2 MiB (3.7% of all the machine's CPU over 15 TPC-DS SF 1
    queries, the kernel's largest single cost; 0.35% without, and the queries 1,621 -> 1,551 ms,
    medians of three runs each). Nothing happens where the call does not exist."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def exit_with(parent: int | None) -> None:
    """Exit once ``parent`` is no longer this process's parent: a local cluster's devices and
    servers live as long as the program that made them, even one killed before it could stop
    them (a killed benchmark left four devices listening for an hour). A started cluster
    (``quarry up``) is not given one: it outlives the command."""
    if parent is None:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        print(f"the process that started this one ({parent}) is gone: exiting", file=sys.stderr)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quarry.device")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_options(commands.add_parser("serve", help="run one device"))
    options = parser.parse_args(argv)
    without_huge_pages()
    exit_with(options.exit_with)
    from quarry.device.server import serve_with

    try:
        serve_with(
            options.data,
            options.port,
            options.profile,
            options.host,
            options.name,
            options.ready_file,
            options.profiles,
            options.credentials,
            options.tls,
            options.insecure,
            options.verify_clients,
            options.host_label,
            options.rack,
            options.metrics_port,
        )
    except QuarryError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
