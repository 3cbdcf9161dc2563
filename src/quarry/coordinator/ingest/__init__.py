"""Ingest: files, tables and data frames read as record batches (``sources``), stored on the
devices all or nothing (``atomic``)."""
