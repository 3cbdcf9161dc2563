"""Sample data quarry generates for demos, tests and benchmarks."""
