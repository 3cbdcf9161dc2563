"""Units of work every device runs; each module here registers one (found by itself)."""
