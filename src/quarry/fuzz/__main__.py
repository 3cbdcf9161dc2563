"""One worker: ``python -m quarry.fuzz TARGET --inputs N --seed S`` prints its outcomes as JSON."""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from quarry.fuzz import core, decoders


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m quarry.fuzz")
    parser.add_argument("target", choices=decoders.target_names())
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quarry-fuzz-") as folder:
        target, seeds = decoders.targets(Path(folder))[args.target]
        outcomes = core.run(target, seeds, args.inputs, random.Random(args.seed))
    print(json.dumps(outcomes.to_json()))


if __name__ == "__main__":
    main()
