"""A SQL query on the host, from text to rows (``run.Query``): the cut and the cost model's
choice of where each fragment starts (``planning``, fed by ``cost_inputs`` and ``selectivity``,
kept by ``plan_cache`` and ``settled_cuts``), fragments as device tasks (``fragments``), a
join's keys sent to its probe (``join_keys``), the host's own admission (``host_admission``),
EXPLAIN (``explain``) and where the time went (``timing``)."""
