"""Write the pinned subset of SQLite's sqllogictest corpus that the test suite runs.

    python scripts/sqllogictest_subset.py CORPUS [--out tests/sqllogictest/corpus]

``CORPUS`` is a checkout of ``gregrahn/sqllogictest`` (``scripts/fetch_sqllogictest.sh``). For
each file of ``FILES`` the subset keeps every statement (the tables) and one query in
``every``, with the expected answers as they are; the queries an ``onlyif`` reserves for
another engine are left out. The result is small enough to check in (``tests/sqllogictest/
corpus/NOTICE`` says where it came from); ``bench/sqllogictest.py`` runs the whole files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.sqllogictest.runner import read_script, written

# file -> keep one query in this many
FILES = {
    "test/select1.test": 20,
    "test/select2.test": 20,
    "test/select3.test": 20,
    "test/select4.test": 20,
    "test/select5.test": 20,
    "test/random/aggregates/slt_good_0.test": 100,
    "test/random/aggregates/slt_good_1.test": 100,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path)
    default = Path(__file__).resolve().parents[1] / "tests" / "sqllogictest" / "corpus"
    parser.add_argument("--out", type=Path, default=default)
    args = parser.parse_args()
    for name, every in FILES.items():
        script = read_script(args.corpus / name)
        target = args.out / name.removeprefix("test/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(written(script, range(0, len(script.queries), every)))
        print(f"{target}: {len(script.queries[::every])} of {len(script.queries)} queries")


if __name__ == "__main__":
    main()
