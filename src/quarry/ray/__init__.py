"""Ray Data over a quarry cluster: one read task per partition, filters and columns pushed down.

    import quarry.ray
    ds = quarry.ray.read_dataset(".quarry/cluster.json", "physics/particles",
                                 columns=["id", "ke"], filter="ke > 3")
    ds.filter(expr=col("x") < 50).sum("ke")

Ray is imported only here: quarry does not need it otherwise. See ``docs/scale-out.md``.
"""

from __future__ import annotations

from quarry.ray.datasource import QuarryDatasource, read_dataset

__all__ = ["QuarryDatasource", "read_dataset"]
