"""Fuzzing every decoder and reader quarry exposes (TigerBeetle's habit: faults as tests).

``core``: mutations and outcomes; ``decoders``: in-process targets (wire frames, Substrait
stages, stored slices, ingest files); ``workers``: those targets in child processes, so a crash
or a hang is counted, not fatal; ``live``: a running device fed malformed action bodies,
tickets and descriptors over Flight. ``bench/fuzz.py`` runs them all.
"""
