"""Kubernetes resource quantities: one parser for the whole app.

The grammar is ``resource.Quantity``'s (k8s.io/apimachinery/pkg/api/resource/quantity.go): a signed
decimal number, optionally with an exponent, and a binary (Ki..Ei) or decimal (n, u, m, k, M..E)
suffix. A malformed quantity raises :class:`~shared.kernel.errors.Invalid`: it never reads as zero,
so a malformed request can never "fit".
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from shared.kernel.errors import Invalid

_SUFFIX = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes resource quantity ("500m", "16Gi", "1e3") as a Decimal; Invalid when it is not one."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise Invalid(f"not a resource quantity: {text!r}")
    try:
        return Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""]
    except InvalidOperation:
        raise Invalid(f"not a resource quantity: {text!r}") from None


def quantity(text: str) -> float:
    """The quantity as a float, for sums and comparisons ("500m" -> 0.5); Invalid when malformed."""
    return float(parse_quantity(text))


def whole_units(text: str) -> int:
    """Whole units of an extended resource such as ``nvidia.com/gpu`` (rounded down); Invalid when malformed.

    Extended resources are integers (the API server refuses fractions for them), so rounding down
    only matters for a value no kubelet reports.
    """
    return int(parse_quantity(text))


def format_quantity(value: Decimal) -> str:
    """Canonical text for a summed quantity: whole numbers plain, fractions in milli-units."""
    if value == value.to_integral_value():
        return str(int(value))
    millis = (value * 1000).to_integral_value()
    return f"{int(millis)}m"
