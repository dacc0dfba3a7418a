"""What the RNN kernels of one layer share: the node's tensors for that layer, the sizes, and the
scratch buffers that chain the kernels (direct_rnn.py says how).

Scratch, in the compute type unless said otherwise:

- ``rnn_xproj`` [T, N, D, G, H]: the layer's input projections W_ih x + b_ih, all gates and
  directions, written by the projection GEMM (rnn_projection.py), read by the steps;
- ``rnn_h`` [2, D, N, H]: the hidden state, double-buffered by step parity (step s reads
  parity s % 2, writes the other), so a step never overwrites what its other blocks read;
- ``rnn_h16`` [2, D, N, H] in the tensor-core step's 16-bit operand type: h rounded as the
  product takes it, which that step stages with 16-byte copies (rnn_step_mma.py says when);
- ``rnn_c`` [D, N, H]: LSTM's cell state (each element read and written by one thread);
- ``rnn_step`` (two unsigned ints): the step the next step kernel runs, and the ticket that
  finds its last block (which advances the step); the projection resets both;
- ``rnn_layer0`` / ``rnn_layer1`` [T, N, D*H]: a layer's output sequence, which the next
  layer's projection reads (alternating, so layer l+1 never writes what layer l reads).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from fusion_rules import FusedNode
from graphdnn.errors import UnsupportedError
from graphdnn.ir import Node, Tensor
from graphdnn.ops.rnn import GATES, WEIGHTS_PER_DIRECTION, RnnAttributes

from ..context import EmitContext
from ..indexing import offset_at
from .direct_common import THREADS, anchor_of, compute_for

XPROJ, STATE_H, STATE_C, STEP = "rnn_xproj", "rnn_h", "rnn_c", "rnn_step"
STATE_H16 = "rnn_h16"


def layer_buffer(layer: int) -> str:
    """The scratch buffer that holds ``layer``'s output sequence (two, alternating)."""
    return f"rnn_layer{layer % 2}"


@dataclass(frozen=True)
class RnnLayer:
    """One layer of an rnn node, as its kernels see it."""

    fused: FusedNode
    layer: int
    compute: str  # float or double

    @classmethod
    def of(cls, fused: FusedNode, layer: int) -> RnnLayer:
        return cls(fused, layer, compute_for(fused))

    @property
    def node(self) -> Node:
        return anchor_of(self.fused)

    @property
    def a(self) -> RnnAttributes:
        a = self.node.attributes
        assert isinstance(a, RnnAttributes)
        return a

    @property
    def x(self) -> Tensor:
        x = self.node.input("x")
        assert x is not None
        return x

    @property
    def steps(self) -> int:
        return int(self.x.static_dim[0])

    @property
    def batch(self) -> int:
        return int(self.x.static_dim[1])

    @property
    def hidden(self) -> int:
        return self.a.hidden_size

    @property
    def gates(self) -> int:
        return GATES[self.a.mode]

    @property
    def directions(self) -> int:
        return self.a.directions

    @property
    def width(self) -> int:
        """Elements of one step's input of this layer: I for layer 0, D*H above."""
        return int(self.x.static_dim[2]) if self.layer == 0 else self.directions * self.hidden

    @property
    def last(self) -> bool:
        return self.layer == self.a.num_layers - 1

    @property
    def element_bytes(self) -> int:
        return 8 if self.compute == "double" else 4

    def weights(self, direction: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """w_ih, w_hh, b_ih, b_hh of ``direction`` in this layer."""
        first = (self.layer * self.directions + direction) * WEIGHTS_PER_DIRECTION
        w_ih, w_hh, b_ih, b_hh = self.node.inputs_of("weights")[first : first + WEIGHTS_PER_DIRECTION]
        return w_ih, w_hh, b_ih, b_hh


def launch_choice(
    ctx: EmitContext, node: str, key: str, default: object, allowed: Collection[object], takes: str
) -> object:
    """The rnn node's launch choice ``key`` (``default`` when not given); an error naming the
    node, the choice and the values it ``takes`` otherwise."""
    value = ctx.tuning.get(key, default)
    if value not in allowed or isinstance(value, bool):
        raise UnsupportedError(f"launch choice {key} takes {takes}, not {value!r}", node=node)
    return value


IN_FLIGHT = 8  # loads each thread issues before it stores them, when staging into shared memory


def staged_copy(start: str, count: str, index: list[str], value: str, target: str, c_type: str) -> list[str]:
    """Copy ``count`` elements into shared memory, element i (from ``start``, a stride of
    THREADS) being ``value`` stored at ``target`` after the ``index`` lines: IN_FLIGHT loads
    per thread are issued before any of them is stored, since a loop of one load then one store
    waits a whole L2 round trip per element."""
    return [
        f"for (int base = {start}; base < {count}; base += {IN_FLIGHT} * {THREADS}) {{",
        f"  {c_type} batch[{IN_FLIGHT}];",
        "#pragma unroll",
        f"  for (int r = 0; r < {IN_FLIGHT}; ++r) {{",
        f"    const int i = base + r * {THREADS};",
        f"    if (i >= {count}) break;",
        *("    " + line for line in index),
        f"    batch[r] = {value};",
        "  }",
        "#pragma unroll",
        f"  for (int r = 0; r < {IN_FLIGHT}; ++r) {{",
        f"    const int i = base + r * {THREADS};",
        f"    if (i < {count}) {target} = batch[r];",
        "  }",
        "}",
    ]


def by_direction(directions: int, direction: str, values: list[str]) -> str:
    """``values[direction]`` as a C expression (one value per direction)."""
    return values[0] if directions == 1 else f"({direction} ? {values[1]} : {values[0]})"


@dataclass(frozen=True)
class StepProduct:
    """How a step kernel computes h_{t-1} @ W_hh^T: ``constants`` and ``shared`` declarations;
    ``product``, which runs for the ``sequences`` sequences from n0 on; then, for each (n, j)
    it covers, the lines between ``cell_open`` and ``cell_close`` run with ``product_of``
    (an expression in g) as gate g's product, and ``state_stores`` once ``h_new`` (the state
    the step leaves for sequence n, unit j) is known. ``shared_bytes``: the dynamic shared
    memory ``shared`` declares (0: static only). ``cells`` > 0: each thread updates that many
    cells per pass, the q-th (q from 0) at the (n, j) that the ``cell_at`` lines compute (they
    ``continue`` past a cell it has not), so its operands can be loaded before the product."""

    constants: list[str]
    shared: list[str]
    sequences: int
    product: list[str]
    cell_open: list[str]
    cell_close: list[str]
    product_of: str
    state_stores: tuple[str, ...] = ()
    shared_bytes: int = 0
    cells: int = 0
    cell_at: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepSources:
    """C expressions the product paths stage from: ``weight`` is W_hh[g * H + j][k] (of
    direction ``dir``), ``h_prev`` is h_{t-1}[m][k] (hx, or zero, at step 0)."""

    weight: str
    h_prev: str


def stage_step_operands(
    sources: StepSources, sequences: str, h_target: str, c_type: str, convert: Callable[[str], str], zero: str
) -> list[str]:
    """A step kernel's k chunk from k0: the block's W_hh rows, then h_{t-1} (see
    :func:`stage_step_weights` and :func:`stage_step_state`)."""
    return [
        *stage_step_weights(sources, c_type, convert, zero),
        *stage_step_state(sources, sequences, h_target, c_type, convert, zero),
    ]


def stage_step_weights(sources: StepSources, c_type: str, convert: Callable[[str], str], zero: str) -> list[str]:
    """The k chunk from k0 of the block's W_hh rows into ``ws`` (row stride STRIDE), as
    ``c_type`` through ``convert``."""
    weight = convert(f"j < u0 + U && j < H && k < H ? {sources.weight} : {zero}")
    return staged_copy(
        "threadIdx.x",
        "ROWS * KC",
        ["const int g = (i / KC) % G, j = u0 + i / KC / G, k = k0 + i % KC;"],
        weight,
        "ws[(i / KC) * STRIDE + i % KC]",
        c_type,
    )


def stage_step_state(
    sources: StepSources, sequences: str, h_target: str, c_type: str, convert: Callable[[str], str], zero: str
) -> list[str]:
    """The k chunk from k0 of h_{t-1} of ``sequences`` sequences from n0 into ``h_target``
    (element i: sequence i / KC, k i % KC), as ``c_type`` through ``convert``."""
    h = convert(f"m < N && k < H ? {sources.h_prev} : {zero}")
    return staged_copy(
        "threadIdx.x", f"{sequences} * KC", ["const int m = n0 + i / KC, k = k0 + i % KC;"], h, h_target, c_type
    )


def advance_step(counter: str) -> list[str]:
    """A step kernel's last lines: the last block to finish advances the ``counter`` scratch's
    step (read as ``step``) for the next launch."""
    return [
        "__syncthreads();",
        "if (threadIdx.x == 0) {  // the last block to finish advances the step for the next launch",
        "  __threadfence();",
        f"  if (atomicAdd(&{counter}[1], 1u) == gridDim.x * gridDim.y - 1) {{ {counter}[1] = 0; {counter}[0] = step + 1; }}",
        "}",
    ]


def length_check(name: str | None, lengths: Tensor | None) -> list[str]:
    """``within``: whether step t is inside sequence n (a length outside [0, T], which the
    reference refuses, is clamped)."""
    if name is None or lengths is None:
        return ["const bool within = true;"]
    return [
        f"const long long given = (long long){name}[{offset_at(lengths, ['n'])}];",
        "const bool within = t < (given < 0 ? 0 : given > T ? T : given);",
    ]
