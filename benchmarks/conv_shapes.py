"""The geometry of the square 2-d convolution layers the convolution benchmarks time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SquareConv:
    """N images of C channels and HW x HW pixels, K filters of SIZE x SIZE, padded by SIZE // 2
    on each side (the output keeps the size at stride 1)."""

    n: int
    c: int
    hw: int
    k: int
    size: int
    stride: int = 1

    @property
    def pad(self) -> int:
        return self.size // 2

    @property
    def out_hw(self) -> int:
        return (self.hw + 2 * self.pad - self.size) // self.stride + 1
