"""The slice-naming convention (DESIGN §2): any processor can name any slice without a lookup.

    <domain>/<dataset>/<partition, 4 digits>/<slice, 8 digits>        one key-value
    <domain>/<dataset>/<partition, 4 digits>/<slice, 8 digits>.<stripe, 3 digits>   striped
    <domain>/<dataset>/<partition, 4 digits>/meta                    the metadata slice

Slice numbers are dense and zero-padded, so key order is write order. System keys live under
``~`` (it sorts after every letter and digit, so no dataset prefix ever covers them).
"""

from __future__ import annotations

import re

from quarry.errors import InvalidName

PARTITION_DIGITS = 4
SLICE_DIGITS = 8
STRIPE_DIGITS = 3
PARTITIONS_MAX = 10**PARTITION_DIGITS
SLICES_MAX = 10**SLICE_DIGITS
STRIPES_MAX = 10**STRIPE_DIGITS

SYSTEM_PREFIX = "~"
PENDING_PREFIX = "~pending/"
# a partition moved away: its rows stay a while for queries planned before the move
RETIRED_PREFIX = "~retired/"
CACHE_PREFIX = "~cache/"

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def check_identifier(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise InvalidName(
            f"invalid {kind} name {name!r}: use letters, digits and underscores, starting with "
            "a letter (it becomes a SQL identifier), at most 63 characters"
        )
    return name


def split_dataset(dataset: str) -> tuple[str, str]:
    """'domain/name' -> ('domain', 'name'), validated."""
    if not isinstance(dataset, str) or dataset.count("/") != 1:
        raise InvalidName(
            f"invalid dataset {dataset!r}: name it DOMAIN/NAME, for example 'physics/particles'"
        )
    domain, name = dataset.split("/")
    return check_identifier("domain", domain), check_identifier("dataset", name)


def dataset_prefix(domain: str, dataset: str) -> str:
    return f"{domain}/{dataset}/"


def partition_prefix(domain: str, dataset: str, partition: int) -> str:
    assert 0 <= partition < PARTITIONS_MAX, partition
    return f"{domain}/{dataset}/{partition:0{PARTITION_DIGITS}d}/"


def slice_key(domain: str, dataset: str, partition: int, slice_number: int) -> str:
    assert 0 <= slice_number < SLICES_MAX, slice_number
    return f"{partition_prefix(domain, dataset, partition)}{slice_number:0{SLICE_DIGITS}d}"


def stripe_key(base_key: str, stripe: int) -> str:
    assert 0 <= stripe < STRIPES_MAX, stripe
    return f"{base_key}.{stripe:0{STRIPE_DIGITS}d}"


def slice_value_keys(base_key: str, stripes: int) -> list[str]:
    """The key-values holding one slice: the key itself, or its numbered stripes."""
    assert stripes >= 1
    if stripes == 1:
        return [base_key]
    return [stripe_key(base_key, i) for i in range(stripes)]


def meta_key(domain: str, dataset: str, partition: int) -> str:
    return f"{partition_prefix(domain, dataset, partition)}meta"


def pending_key(domain: str, dataset: str, partition: int) -> str:
    return f"{PENDING_PREFIX}{domain}/{dataset}/{partition:0{PARTITION_DIGITS}d}"


def retired_key(domain: str, dataset: str, partition: int) -> str:
    return f"{RETIRED_PREFIX}{domain}/{dataset}/{partition:0{PARTITION_DIGITS}d}"
