"""Storage servers: the intermediate level of the hierarchy, between the host and its drives.

``service`` is the process (a device to its upstream, a coordinator to its drives); ``work``
is its side of a work exchange. ``python -m quarry.server serve`` starts one.
"""
