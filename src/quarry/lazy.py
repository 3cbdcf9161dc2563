"""``cached_property`` without a lock: a value worked out on first use, kept on the instance.

Python 3.11's ``functools.cached_property`` computes under one lock per property, shared by
every instance of the class: a device's requests, each with its own unit and key cuts, waited
on one another's first use of the same property (decoding a plan, building a key table), on
threads that otherwise run at once. Python 3.12 dropped that lock; this is its behaviour. Two
threads that reach a value first at the same moment may both compute it, and one result
stays: every use here computes from the instance's own inputs, so both are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class cached_property(Generic[T]):
    def __init__(self, compute: Callable[[Any], T]):
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> cached_property[T]: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = self.compute(instance)
        instance.__dict__[self.name] = value  # found there first from now on
        return value
