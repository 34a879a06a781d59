"""Kubernetes resource quantities, the two we read: CPU (to millicores) and memory (to bytes)."""

from __future__ import annotations

import functools
import math
import re
from decimal import Decimal, InvalidOperation

_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
# Far beyond any machine: a request above this is a typo, not a server.
MAX_CPU_MILLI = 1_000_000 * 1000
# The apiserver keeps a quantity's value in an int64; memory past that is no node's.
MAX_MEMORY_BYTES = 2**63 - 1


class QuantityError(ValueError):
    pass


def parse_quantity(value: object, what: str = "quantity") -> Decimal:
    if isinstance(value, bool) or value is None:
        raise QuantityError(f"{what} {value!r} is not a Kubernetes quantity")
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"{what} {value!r} is not a Kubernetes quantity (e.g. 8, 500m, 64Gi)")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        raise QuantityError(f"{what} {value!r} is not a Kubernetes quantity") from None
    if not number.is_finite():
        raise QuantityError(f"{what} {value!r} is not a finite quantity")
    return number * _SUFFIX[match.group(2) or ""]


def cpu_milli(value: object) -> int:
    """CPU quantity -> millicores, rounded up as the apiserver does. Negative or absurd values raise."""
    if type(value) is str:
        return _cpu_milli_text(value)
    return _parse_cpu_milli(value)


# Every pod listed or watched reads its containers' CPU quantities, and a fleet writes only a handful of distinct
# strings ("500m", "2", "16"): remembered, each read is one lookup. Bounded, so that odd input cannot grow it; a
# string that does not parse raises and is not kept.
@functools.lru_cache(maxsize=4096)
def _cpu_milli_text(value: str) -> int:
    return _parse_cpu_milli(value)


def _parse_cpu_milli(value: object) -> int:
    amount = parse_quantity(value, "cpu")
    if amount < 0:
        raise QuantityError(f"cpu {value!r} is negative")
    milli = math.ceil(amount * 1000)
    if milli > MAX_CPU_MILLI:
        raise QuantityError(f"cpu {value!r} is larger than any node ({MAX_CPU_MILLI // 1000} CPUs)")
    return milli


def memory_bytes(value: object) -> int:
    if type(value) is str:
        return _memory_bytes_text(value)
    return _parse_memory_bytes(value)


@functools.lru_cache(maxsize=4096)  # as `_cpu_milli_text`: every pod's memory is read, in few distinct strings
def _memory_bytes_text(value: str) -> int:
    return _parse_memory_bytes(value)


def _parse_memory_bytes(value: object) -> int:
    amount = parse_quantity(value, "memory")
    if amount < 0:
        raise QuantityError(f"memory {value!r} is negative")
    if amount > MAX_MEMORY_BYTES:
        raise QuantityError(f"memory {value!r} is larger than any node (8Ei)")
    return math.ceil(amount)


def format_cpu(milli: int) -> str:
    """Millicores -> the shortest quantity string: 8000 -> "8", 1500 -> "1500m"."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
