"""Who is in a cluster and what they hold: the devices (``membership``), the typed client of
each (``device_client``, which asks a busy device again after the wait it named: ``backoff``),
the catalog rebuilt from what they say (``catalog``), whether it still holds (``freshness``)
and where a dataset's partitions go (``placement``). No central metadata server: ask the
devices again and the same catalog comes back."""
