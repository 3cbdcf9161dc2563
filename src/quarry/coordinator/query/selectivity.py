"""How many rows a filter conjunct keeps, counted on the slice the host samples its dataset by.

``split_predicate_by_capability`` orders a fragment's conjuncts by rank, (selectivity - 1) / cost
(POLARDB §3.1.3); without a figure it takes System R's textbook guesses, which know nothing of
the data: to them TPC-H Q12's ``l_shipdate < l_commitdate`` keeps a third of lineitem (half,
in fact) and ``l_receiptdate < DATE '1995-01-01'`` a third (two fifths). Counted on one real
slice (``figures.sample_slice``, the slice the cost model samples too), the order follows the
data. A decomposition is kept per query and catalog version, so the count runs once per query
text until the data changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quarry.coordinator.query.cost_inputs import sample_slice
from quarry.device.units.substrait import run_on_host
from quarry.errors import QuarryError
from quarry.plan.errors import StageError

if TYPE_CHECKING:
    from quarry.coordinator.membership.catalog import DatasetEntry
    from quarry.coordinator.membership.membership import Membership


class SampledSelectivity:
    """An estimator for ``decompose(selectivity=...)`` over one catalog: a conjunct's share of
    its dataset's sampled slice, or None (the textbook guess) when it cannot be counted there."""

    def __init__(self, cluster: Membership, catalog: dict[str, DatasetEntry]) -> None:
        self.cluster = cluster
        self.catalog = catalog

    def __call__(self, conjunct: dict) -> float | None:
        entry = self.catalog.get(conjunct["dataset"])
        if entry is None or entry.unavailable or not entry.rows or not conjunct.get("stage"):
            return None
        try:
            batches, _ = sample_slice(self.cluster, entry)
            rows = sum(batch.num_rows for batch in batches)
            if not rows:
                return None
            kept = sum(b.num_rows for b in run_on_host(conjunct["stage"], entry.schema, batches))
        except (QuarryError, StageError):
            return None  # the conjunct's error, if it is one, is the query's when it runs
        return kept / rows
