"""A Ray Data datasource: each read task reads one partition through the cluster.

The datasource asks the cluster's catalog for the dataset's partitions and makes one read task
per non-empty partition (``parallelism`` is a hint Ray gives; a partition is the unit the
devices hold, so it is the unit read). A task runs on any Ray worker: it opens the cluster from
its cluster file (the file carries the credentials' location; workers on other machines need
the same paths) and reads its partition's rows of ``SELECT columns FROM dataset WHERE filter``
(``coordinator.partition_read``): the devices filter and project next to the data.

What the tasks brought over (bytes the devices shipped and read, rows) is tallied by a small
actor the datasource starts: ``QuarryDatasource.moved()``.

Ray's optimizer pushes down what it can (``supports_projection_pushdown``,
``supports_predicate_pushdown``): a ``select_columns`` becomes the columns read, a
``filter(expr=...)`` the WHERE clause, translated to SQL (``sql_of``). A predicate with parts SQL
cannot say (a Python UDF) is evaluated by the read task on each block instead, with pyarrow, so
the answer never depends on what was pushed. Aggregates are Ray's: Ray Data has no hook that
hands a datasource a partial aggregation; ``cluster.sql`` pushes those down on one host.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask
from ray.data.expressions import BinaryExpr, ColumnExpr, Expr, LiteralExpr, Operation, UnaryExpr

from quarry.errors import QueryError
from quarry.pushdown import Pushdown

SQL_OPERATORS = {
    Operation.ADD: "+",
    Operation.SUB: "-",
    Operation.MUL: "*",
    Operation.DIV: "/",
    Operation.MOD: "%",
    Operation.GT: ">",
    Operation.LT: "<",
    Operation.GE: ">=",
    Operation.LE: "<=",
    Operation.EQ: "=",
    Operation.NE: "<>",
    Operation.AND: "AND",
    Operation.OR: "OR",
}


class NotSql(ValueError):
    """A Ray expression with a part SQL cannot say."""


def sql_of(expression: Expr) -> str:
    """A Ray Data expression as a SQL expression, every name quoted and every literal typed."""
    if isinstance(expression, ColumnExpr):
        return '"' + expression.name.replace('"', '""') + '"'
    if isinstance(expression, LiteralExpr):
        return _literal(expression.value)
    if isinstance(expression, BinaryExpr):
        if expression.op in (Operation.IN, Operation.NOT_IN):
            values = expression.right
            if not isinstance(values, LiteralExpr) or not isinstance(values.value, list | tuple):
                raise NotSql(f"IN over {values!r}")
            listed = ", ".join(_literal(v) for v in values.value)
            word = "IN" if expression.op is Operation.IN else "NOT IN"
            return f"({sql_of(expression.left)} {word} ({listed}))"
        if expression.op not in SQL_OPERATORS:
            raise NotSql(f"operation {expression.op}")
        left, right = sql_of(expression.left), sql_of(expression.right)
        return f"({left} {SQL_OPERATORS[expression.op]} {right})"
    if isinstance(expression, UnaryExpr):
        operand = sql_of(expression.operand)
        if expression.op is Operation.NOT:
            return f"(NOT {operand})"
        if expression.op is Operation.IS_NULL:
            return f"({operand} IS NULL)"
        if expression.op is Operation.IS_NOT_NULL:
            return f"({operand} IS NOT NULL)"
    raise NotSql(f"{type(expression).__name__}")


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        if value != value or value in (float("inf"), float("-inf")):
            raise NotSql(f"the literal {value}")
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise NotSql(f"a literal of type {type(value).__name__}")


class QuarryDatasource(Datasource):
    """A dataset of a quarry cluster, read one partition per task."""

    def __init__(
        self,
        cluster_file: str | Path,
        dataset: str,
        columns: list[str] | None = None,
        filter: str | None = None,
        pushdown: Pushdown | str = Pushdown.ALWAYS,
    ):
        super().__init__()
        import quarry

        self.cluster_file = str(cluster_file)
        self.dataset = dataset
        self.pushdown = Pushdown.parse(pushdown)
        self.where = [f"({filter})"] if filter else []
        self.local: Expr | None = None  # evaluated by the read task: not SQL
        self._projection_map = {c: c for c in columns} if columns is not None else None
        # held here (and in every copy Ray's optimizer makes): the tally lives while we do
        self.tally = _Tally.options(num_cpus=0).remote()
        cluster = quarry.connect(self.cluster_file)
        try:
            entry = cluster.entry(dataset)
            self.schema = entry.schema
            self.partitions = [(p.partition, p.rows, p.bytes_arrow) for p in entry.partitions
                               if p.rows]  # fmt: skip
        finally:
            cluster.close()

    def moved(self) -> dict[str, Any]:
        """What the read tasks that ran so far brought over, per partition and in all: bytes
        the devices shipped and read off their stores, rows delivered to Ray."""
        parts = ray.get(self.tally.totals.remote())
        total = {key: sum(p[key] for p in parts.values()) for key in MOVED}
        return {**total, "partitions": parts}

    def get_name(self) -> str:
        return f"Quarry({self.dataset})"

    def supports_projection_pushdown(self) -> bool:
        return True

    def supports_predicate_pushdown(self) -> bool:
        return True

    def apply_predicate(self, predicate_expr: Expr) -> QuarryDatasource:
        """Into the WHERE clause when SQL can say it, else for the read task to evaluate."""
        clone = super().apply_predicate(predicate_expr)
        try:
            clone.where = [*self.where, sql_of(predicate_expr)]
        except NotSql:
            clone.local = predicate_expr if self.local is None else self.local & predicate_expr
            clone.where = list(self.where)
        return clone

    def sql(self) -> str:
        columns = self._get_data_columns()
        select = "*" if columns is None else ", ".join(sql_of(ColumnExpr(c)) for c in columns)
        domain, name = self.dataset.split("/", 1)
        where = f" WHERE {' AND '.join(self.where)}" if self.where else ""
        return f'SELECT {select} FROM "{domain}"."{name}"{where}'

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(size for _, _, size in self.partitions)

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        sql, local, cluster_file = self.sql(), self.local, self.cluster_file
        pushdown, tally = self.pushdown, self.tally
        filtered = bool(self.where) or local is not None
        tasks = []
        for partition, rows, size in self.partitions:
            metadata = BlockMetadata(
                num_rows=None if filtered else rows,
                size_bytes=size,
                input_files=None,
                exec_stats=None,
            )
            tasks.append(
                ReadTask(
                    lambda p=partition: _read(cluster_file, sql, p, local, pushdown, tally),
                    metadata,
                    per_task_row_limit=per_task_row_limit,
                )
            )
        return tasks


def _read(
    cluster_file: str, sql: str, partition: int, local: Expr | None, pushdown: Pushdown, tally: Any
) -> Iterator[pa.Table]:
    """One read task: the partition's rows, as tables of the stream's batches; then what moved,
    to the datasource's tally."""
    import quarry
    from quarry.coordinator.reads.partition_read import read_partition

    cluster = quarry.connect(cluster_file)
    try:
        read = read_partition(cluster, sql, partition, pushdown)
        condition = local.to_pyarrow() if local is not None else None
        rows = 0
        for batch in read.batches:
            table = pa.Table.from_batches([batch], schema=read.schema)
            if condition is not None:
                table = table.filter(condition)
            if table.num_rows:
                rows += table.num_rows
                yield table
        if not rows:
            yield read.schema.empty_table()
        moved = read.moved()
        counted = {name: getattr(moved, name) for name in MOVED_COUNTERS}
        ray.get(tally.add.remote(partition, {**counted, "rows": rows}))
    finally:
        cluster.close()


# what a read task tells the tally of the device's work (``QuarryDatasource.moved``), and what
# the tally sums of each
MOVED_COUNTERS = ("bytes_shipped", "bytes_read", "slices_executed", "slices_pushed_back")
MOVED = ("bytes_shipped", "bytes_read", "rows")


@ray.remote
class _Tally:
    """What each read task brought over, by partition (a task run again replaces its count)."""

    def __init__(self) -> None:
        self.parts: dict[int, dict[str, int]] = {}

    def add(self, partition: int, moved: dict[str, int]) -> None:
        self.parts[partition] = moved

    def totals(self) -> dict[int, dict[str, int]]:
        return dict(self.parts)


def read_dataset(
    cluster_file: str | Path,
    dataset: str,
    columns: list[str] | None = None,
    filter: str | None = None,
    pushdown: Pushdown | str = Pushdown.ALWAYS,
) -> ray.data.Dataset:
    """A Ray dataset of ``dataset`` ("domain/name"): ``columns`` (None: all) of the rows where
    the SQL ``filter`` holds, one read task per partition; later ``select_columns`` and
    ``filter(expr=...)`` are pushed down too."""
    if "/" not in dataset:
        raise QueryError(f"name a dataset as domain/name, got {dataset!r}")
    return ray.data.read_datasource(
        QuarryDatasource(cluster_file, dataset, columns, filter, pushdown)
    )


__all__ = ["QuarryDatasource", "read_dataset", "sql_of"]
