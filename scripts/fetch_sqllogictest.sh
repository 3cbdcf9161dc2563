#!/bin/sh
# SQLite's sqllogictest corpus (public domain test scripts), at the commit quarry's figures
# were measured on, into DEST (default: ./sqllogictest): only the files bench/sqllogictest.py
# runs, test/select1.test .. select5.test and test/random/aggregates/.
#   sh scripts/fetch_sqllogictest.sh [DEST]
#   python bench/sqllogictest.py --corpus DEST
set -eu
DEST=${1:-sqllogictest}
COMMIT=d8d4f4b9a351102ec63196a920e8052f4f025509
git clone --filter=blob:none --no-checkout https://github.com/gregrahn/sqllogictest "$DEST"
cd "$DEST"
git sparse-checkout set --no-cone '/test/select*.test' '/test/random/aggregates/'
git checkout "$COMMIT"
