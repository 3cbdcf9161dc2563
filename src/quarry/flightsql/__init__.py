"""An Arrow Flight SQL endpoint in front of a cluster (``quarry serve``, docs/flightsql.md).

``server`` answers the calls; ``statements`` holds prepared statements and results between them;
``sessions`` gives every token its own cluster handle, so queries run with the caller's role;
``auth`` reads the token of each call; ``parameters`` and ``parameter_types`` bind prepared
statements' values as typed literals; ``catalog`` and ``sqlinfo`` describe the cluster and the
endpoint; ``messages`` are the spec's protobuf messages; ``serve`` and ``process`` start it.
"""
