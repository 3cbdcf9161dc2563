"""Datasets read without SQL: every k-th row drawn on the devices (``sample``), rows in the
order of their source (``source_order``), and one partition of a row-local query, the read task
of a scale-out engine (``partition_read``)."""
