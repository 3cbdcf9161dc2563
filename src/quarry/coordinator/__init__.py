"""The coordinator (the host, DESIGN §1): everything quarry does over a cluster of devices.

Rooms, by job:

- ``membership/``: who is in the cluster and what they hold: the devices and the typed client
  of each, the catalog rebuilt from what they say, its freshness, and placement.
- ``dispatch/``: the one host dispatch every kind of work goes through: tasks out, streams
  merged back, pushed-back ranges completed on the host, failover to a replica, back-off from
  a busy device, and each device's report of the work.
- ``query/``: a SQL query's life: planning and the cost model's cut, fragments as device work,
  join keys, the super-plan's run, the host's own admission, EXPLAIN and where the time went.
- ``reads/``: datasets read without SQL: samples drawn on the devices, rows in their source's
  order, one partition of a row-local query for a scale-out engine.
- ``ingest/``: what users hand over, read as batches, and the atomic ingest that stores it.
- ``processes/``: the embedded default: device and storage-server processes on this machine.
- ``admin/``: keeping the cluster right: repair to the replica count, calibration.

``cluster.Cluster`` is the handle a user holds: it calls into the rooms and none imports it.
"""
