"""The codegen core: canonical kernel sources, readable headers, NVRTC errors with context."""

from __future__ import annotations

import pytest

import fusion_rules as fr
import graphdnn as gd
from codegen import CompileError, compile_cubin, emit_partition
from codegen.kernel import strip_header


def ln_gelu_graph(unrelated_inputs: int) -> gd.OperationGraphSpec:
    """LayerNorm+GELU, declared after some unrelated tensors so its tensor ids shift."""
    g = gd.OperationGraphSpec(name=f"g{unrelated_inputs}", io_data_type="bf16")
    others = [g.tensor(name=f"other{i}", dim=[8, 8]) for i in range(unrelated_inputs)]
    x = g.tensor(name="x", dim=[64, 128])
    y = g.layernorm("inference", x, g.tensor(name="gamma", dim=[1, 128]), g.tensor(name="beta", dim=[1, 128]), 1e-5)[0]
    g.gelu(y).set_output(True)
    for other in others:
        g.relu(other).set_output(True)
    return g


def kernels(graph: gd.OperationGraphSpec) -> list:
    return [k for program in emit_partition(fr.fuse(graph), 90) for k in program.kernels]


def test_the_same_fused_kernel_in_two_graphs_has_one_source() -> None:
    first, second = kernels(ln_gelu_graph(0))[0], kernels(ln_gelu_graph(3))[0]
    assert first.name == second.name
    assert strip_header(first.source) == strip_header(second.source)
    assert first.content_hash == second.content_hash
    assert first.source != second.source  # the headers still name each graph


def test_the_header_names_signature_nodes_and_parameters() -> None:
    graph = ln_gelu_graph(1)
    kernel = kernels(graph)[0]
    header = kernel.source.split("// ---- end of header ----")[0]
    assert graph.signature() in header
    assert "layernorm_0 (layernorm), gelu_0 (gelu)" in header
    assert "t0 = 'x', t1 = 'gamma', t2 = 'beta', t3 = 'gelu_0::y'" in header


def test_headers_for_narrow_types_only_when_used() -> None:
    bf16 = kernels(ln_gelu_graph(0))[0].source
    g = gd.OperationGraphSpec(io_data_type="float")
    g.relu(g.tensor(dim=[4, 4])).set_output(True)
    fp32 = kernels(g)[0].source
    assert "#include <cuda_bf16.h>" in bf16 and "cuda_fp16.h" not in bf16
    assert "#include" not in fp32


@pytest.mark.parametrize(("intermediate", "header"), [("half", "cuda_fp16.h"), ("bfloat16", "cuda_bf16.h")])
def test_narrow_intermediates_of_a_float_graph_include_their_header(intermediate: str, header: str) -> None:
    """Only the virtual values are half or bf16 here: the header follows from the source, not
    from the tensors' types (before, NVRTC said '__half is undefined')."""
    g = gd.OperationGraphSpec(io_data_type="float", intermediate_data_type=intermediate)
    x = g.tensor(dim=[4, 9])
    g.sub(g.neg(g.add(g.elu(x), x)), x).set_output(True)
    (kernel,) = kernels(g)
    assert f"#include <{header}>" in kernel.source
    for arch in (80, 90):
        assert compile_cubin(kernel.source, kernel.name, arch)


def test_a_compile_error_shows_the_log_and_the_generated_line() -> None:
    source = 'extern "C" __global__ void k(float* x) {\n  x[0] = 1.0f;\n  x[1] = undefined_name;\n}\n'
    with pytest.raises(CompileError) as raised:
        compile_cubin(source, "k", 90)
    message = str(raised.value)
    assert 'identifier "undefined_name" is undefined' in message
    assert ">     3 |   x[1] = undefined_name;" in message
