"""Every pointwise op kind in every data type the builder accepts: each compiles for sm_80 and
sm_90, and (``gpu``) runs on an awkward strided, broadcasting shape against the reference.

Tolerances are graphdnn.compare's per output type: the kernels compute in float (double for
double data) where the reference computes in float64, and both round the result to the output's
type, so the error is the type's storage rounding when the result lands near a rounding boundary,
plus float's own error: 2e-5 for float (a few ulps of float arithmetic and the ~1e-6 hardware
exp2 / reciprocal of sigmoid, swish and GELU-tanh), 3e-3 half (2^-9, half an ulp, with room),
1.5e-2 bf16 (2^-8 with room), 0.1 / 0.2 fp8 e4m3 / e5m2 (3 / 2 mantissa bits), 1e-12 double.
Integer and boolean outputs must be exact: their inputs are small integers, so results land on
half-integers (the ties nearest-even rounding decides) only where both sides compute them exactly
(7 / 2, sigmoid(0)).
"""

from __future__ import annotations

import pytest

import graphdnn as gd
from graphdnn.ops.base import Category, get_op, op_kinds
from graphdnn.ops.pointwise import BACKWARD_OF, BINARY_KINDS, UNARY_KINDS

from .compile_check import compile_graphs

# rng, the pointwise op that reads no tensor, and gen_index, which reads only its input's dims, have
# their own tests (tests/test_ops_random.py, tests/test_ops_index.py)
KINDS = sorted(UNARY_KINDS | BINARY_KINDS | set(BACKWARD_OF) | {"binary_select"})
TYPES = [t.value for t in gd.DataType if t.is_set and not t.is_packed]  # 4-bit tensors: weights only (test_packing.py)

# Operand dims by role position: the first input transposed in memory (its innermost axis is
# the 5, stride 1, the 33 strided), the others broadcast along different axes.
OPERANDS = (([3, 5, 33], [165, 1, 5]), ([5, 1], None), ([3, 1, 33], None))


def add_op(g: gd.OperationGraphSpec, kind: str, data_type: str, suffix: str = "") -> None:
    """``kind`` on fresh operands of ``data_type`` (builder defaults for its attributes), its output
    ``kind`` of the same type."""
    inputs = {}
    for position, role in enumerate(get_op(kind).inputs):
        dims, stride = OPERANDS[position]
        inputs[role.name] = g.tensor(dims, stride, data_type=data_type, name=f"{kind}.{role.name}{suffix}")
    getattr(g, kind)(**inputs).set_name(f"{kind}{suffix}").set_data_type(data_type).set_output(True)


def one_op(kind: str, data_type: str) -> gd.OperationGraphSpec:
    g = gd.OperationGraphSpec(name=f"{kind}_{data_type}", intermediate_data_type="float")
    add_op(g, kind, data_type)
    return g


def test_every_pointwise_kind_has_a_builder_with_its_roles() -> None:
    assert {kind for kind in op_kinds() if get_op(kind).category is Category.POINTWISE} == {*KINDS, "rng", "gen_index"}
    for kind in KINDS:
        roles = [role.name for role in get_op(kind).inputs]
        assert len(roles) <= len(OPERANDS), kind
        g = one_op(kind, "float")
        assert g.validate().tensor(kind).dim == (3, 5, 33)


@pytest.mark.parametrize("data_type", TYPES)
def test_every_kind_compiles_in_every_type(data_type: str) -> None:
    """All kinds of one type in one graph (an elementwise kernel or a few): each expression and
    each conversion the GPU test needs passes NVRTC for both targets."""
    g = gd.OperationGraphSpec(name=f"every_pointwise_{data_type}", intermediate_data_type="float")
    for kind in KINDS:
        add_op(g, kind, data_type)
    report = compile_graphs([g.validate()])
    assert report.failures == [], "\n\n".join(report.failures)
    assert report.graphs == 1


@pytest.mark.gpu
@pytest.mark.parametrize("data_type", TYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_in_every_type_matches_the_reference(kind: str, data_type: str) -> None:
    from tests.gpu_check import check_on_gpu

    check_on_gpu(one_op(kind, data_type))
