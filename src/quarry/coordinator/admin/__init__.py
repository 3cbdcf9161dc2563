"""Keeping a cluster right: partitions copied back to their replica count (``repair``) and each
device measured against its profile (``calibrate``)."""
