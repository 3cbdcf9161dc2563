"""The embedded default: device and storage-server processes on this machine. ``spawn``: one
process started, waited for and stopped; ``layouts``: which processes a cluster has, started
together; ``local``: the ``quarry.local(...)`` cluster that owns them."""
