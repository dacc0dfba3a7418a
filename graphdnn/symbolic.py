"""Symbolic dims: named extents with a range, and the exact arithmetic the IR needs of them.

A dynamic dim is a :class:`Symbol` (``batch`` in ``1..256``); dims and strides derived
from symbols are :class:`Sym` products: a positive integer times symbols, kept in one
normal form, so equality is exact (``64*batch*seq`` is one value however it was built).
Products are all the IR needs: packed strides, element counts and reshapes that merge
dims multiply; everything else (a sum, a quotient, an order) is refused with a
:class:`~graphdnn.errors.SymbolicDimError` naming the symbol, which validation turns
into an error naming the node, role and dim.

Over the range of its symbols a product is monotone in each symbol, so its bounds are
its values at the symbols' minima and maxima, and ``a >= b`` holds over the whole range
exactly when it holds at the one corner that favours ``b`` (:func:`counterexample`).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NoReturn

from .errors import ShapeError, SymbolicDimError

# Names follow C identifiers, so that the next slice can pass them to kernels as arguments.
SYMBOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True, order=True)
class Symbol:
    """A named extent known only at execution, somewhere in ``min..max`` (inclusive)."""

    name: str
    min: int
    max: int

    def __str__(self) -> str:
        return f"{self.name} ({self.min}..{self.max})"


def symbol(name: str, min: int, max: int, *, limit: int) -> Symbol:
    """A checked symbol: a C-identifier name and ``1 <= min <= max <= limit``."""
    if not isinstance(name, str) or SYMBOL_NAME.fullmatch(name) is None:
        raise ShapeError(f"symbol name {name!r} must be a C identifier of 1 to 64 characters")
    for what, value in (("min", min), ("max", max)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ShapeError(f"symbol '{name}': {what} must be an integer, got {value!r}")
    if not 1 <= min <= max <= limit:
        raise ShapeError(f"symbol '{name}': range {min}..{max} must satisfy 1 <= min <= max <= {limit}")
    return Symbol(name, min, max)


@dataclass(frozen=True)
class Sym:
    """``coefficient * factors[0] * factors[1] * ...``: a dim or stride that depends on symbols.

    Normal form: ``coefficient >= 1``, at least one factor, factors sorted (a power repeats
    its symbol). A product without symbols is a plain ``int``, never a ``Sym``; so a
    ``Sym`` never equals an ``int``, and two ``Sym`` are equal exactly when they are the
    same function of the symbols.
    """

    coefficient: int
    factors: tuple[Symbol, ...]

    @classmethod
    def of(cls, symbol: Symbol) -> Sym:
        return cls(1, (symbol,))

    @property
    def symbols(self) -> tuple[Symbol, ...]:
        """The distinct symbols, sorted."""
        return tuple(dict.fromkeys(self.factors))

    def __mul__(self, other: object) -> int | Sym:
        if isinstance(other, Sym):
            return _product(self.coefficient * other.coefficient, (*self.factors, *other.factors))
        if isinstance(other, int) and not isinstance(other, bool):
            if other < 0:
                self._refuse("multiplying by a negative number")
            return _product(self.coefficient * other, self.factors)
        return NotImplemented

    __rmul__ = __mul__

    def __bool__(self) -> bool:
        return True  # every symbol is at least 1

    def _refuse(self, what: str) -> NoReturn:
        raise SymbolicDimError(f"{what} needs the value of symbolic dim {self} ({show_ranges(self.symbols)})", self)

    # Everything but multiplication depends on the value: refused, never guessed.
    def __add__(self, other: object) -> NoReturn:
        self._refuse("adding")

    __radd__ = __add__

    def __sub__(self, other: object) -> NoReturn:
        self._refuse("subtracting")

    __rsub__ = __sub__

    def __floordiv__(self, other: object) -> NoReturn:
        self._refuse("dividing")

    __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = __rmod__ = __floordiv__

    def __pow__(self, other: object) -> NoReturn:
        self._refuse("raising to a power")  # products are written as repeated factors

    def __neg__(self) -> NoReturn:
        self._refuse("negating")

    def __lt__(self, other: object) -> NoReturn:
        self._refuse("comparing")

    __le__ = __gt__ = __ge__ = __lt__

    def __index__(self) -> NoReturn:
        self._refuse("using it as an integer")

    __int__ = __float__ = __index__

    def __str__(self) -> str:
        names = "*".join(s.name for s in self.factors)
        return names if self.coefficient == 1 else f"{self.coefficient}*{names}"

    __repr__ = __str__


Extent = int | Sym  # a dim or a stride


def _product(coefficient: int, factors: tuple[Symbol, ...]) -> int | Sym:
    if coefficient == 0 or not factors:
        return coefficient
    ordered = tuple(sorted(factors))
    for a, b in itertools.pairwise(ordered):
        if a.name == b.name and a != b:
            raise SymbolicDimError(f"symbol '{a.name}' is used with two ranges, {a.min}..{a.max} and {b.min}..{b.max}")
    return Sym(coefficient, ordered)


def symbols_of(values: Iterable[Extent]) -> tuple[Symbol, ...]:
    """The distinct symbols in ``values``, in order of appearance."""
    found: dict[Symbol, None] = {}
    for v in values:
        if isinstance(v, Sym):
            found.update(dict.fromkeys(v.factors))
    return tuple(found)


def lower(value: Extent) -> int:
    """The smallest value over the symbols' ranges."""
    if isinstance(value, Sym):
        return value.coefficient * math.prod(s.min for s in value.factors)
    return value


def upper(value: Extent) -> int:
    """The largest value over the symbols' ranges."""
    if isinstance(value, Sym):
        return value.coefficient * math.prod(s.max for s in value.factors)
    return value


def evaluate(value: Extent, values: Mapping[str, int]) -> int:
    """The value of ``value`` when each symbol takes ``values[name]``."""
    if isinstance(value, Sym):
        return value.coefficient * math.prod(values[s.name] for s in value.factors)
    return value


def counterexample(a: Extent, b: Extent) -> dict[str, int] | None:
    """None when ``a >= b`` for every value of the symbols in range; else values of the
    symbols that decide it (the others cancel out) where ``a < b``.

    ``a / b`` is a product of symbols with integer exponents, monotone in each symbol, so
    it is smallest at the corner where each symbol with a positive exponent is at its
    minimum and each other one at its maximum: checking that corner is exact.
    """
    exponent: dict[Symbol, int] = {}
    for s in a.factors if isinstance(a, Sym) else ():
        exponent[s] = exponent.get(s, 0) + 1
    for s in b.factors if isinstance(b, Sym) else ():
        exponent[s] = exponent.get(s, 0) - 1
    corner = {s.name: s.min if e >= 0 else s.max for s, e in exponent.items()}
    if evaluate(a, corner) >= evaluate(b, corner):
        return None
    return {s.name: corner[s.name] for s, e in exponent.items() if e}  # the symbols the outcome depends on


def show(values: Iterable[Extent]) -> str:
    """``[batch, 128]`` with each symbol's range after it: ``[batch, 128] (batch in 1..256)``."""
    values = list(values)
    ranges = show_ranges(symbols_of(values))
    return f"[{', '.join(map(str, values))}]" + (f" ({ranges})" if ranges else "")


def show_ranges(symbols: Iterable[Symbol]) -> str:
    """``batch in 1..256, seq in 1..2048``."""
    return ", ".join(f"{s.name} in {s.min}..{s.max}" for s in symbols)


def show_values(values: Mapping[str, int]) -> str:
    return ", ".join(f"{name} = {value}" for name, value in sorted(values.items()))
