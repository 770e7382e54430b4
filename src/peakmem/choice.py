"""Choice: the base of every option enum (precision, optimizer, engine, FSDP mode, ...)."""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from peakmem.errors import InputError

_C = TypeVar("_C", bound="Choice")


class Choice(str, Enum):
    """An enum parsed from its CLI spelling with an error that names the field and lists the choices."""

    @classmethod
    def parse(cls: type[_C], value: str, field: str) -> _C:
        for member in cls:
            if member.value == value.lower():
                return member
        choices = ", ".join(m.value for m in cls)
        raise InputError(f"{field}={value!r}: unknown; choose one of {choices}")
