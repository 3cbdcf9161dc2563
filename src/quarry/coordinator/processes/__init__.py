"""The embedded default: device and storage-server processes on this machine, started,
stopped and restarted (``local``), and the ``quarry.local(...)`` cluster that owns them."""
