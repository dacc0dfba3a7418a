"""``graphdnn.cudnn``'s translation of the frontend's ragged attention tensors (cudnn/ragged.py):
what is refused and why, the buffers a packed tensor binds, the plan it compiles to.

Whole ragged programs (forward and backward, against each sequence alone through the dense
frontend sdpa) are tests/cudnn_programs.py's sdpa_ragged and sdpa_backward_ragged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import graphdnn.cudnn as cudnn
from graphdnn.errors import DataTypeError, FeedError, UnsupportedError
from graphdnn.tensor import TensorSpec

B, H, S, D = 2, 2, 6, 8
BSHD = [S * H * D, D, H * D, 1]
INT32 = cudnn.data_type.INT32


def graph() -> cudnn.pygraph:
    return cudnn.pygraph(
        io_data_type=cudnn.data_type.FLOAT,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )


def offsets(g: cudnn.pygraph, name: str, data_type: Any = INT32) -> TensorSpec:
    return g.tensor(dim=[B + 1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=data_type, name=name)


def lengths(g: cudnn.pygraph) -> dict[str, TensorSpec]:
    return {
        name: g.tensor(dim=[B, 1, 1, 1], stride=[1, 1, 1, 1], data_type=INT32, name=name)
        for name in ("seq_len_q", "seq_len_kv")
    }


def ragged_sdpa(
    g: cudnn.pygraph, strides: dict[str, list[int]] | None = None, shared: str = ""
) -> tuple[list[TensorSpec], TensorSpec, TensorSpec]:
    """A ragged sdpa: Q, K, V with their own offsets (K's also V's when ``shared`` is "kv");
    returns ([Q, K, V], O, Stats)."""
    strides = strides or {}
    qkv = []
    for name in "QKV":
        offset = qkv[1].get_ragged_offset() if shared == "kv" and name == "V" else offsets(g, f"{name}_offsets")
        qkv.append(g.tensor(dim=[B, H, S, D], stride=strides.get(name, BSHD), ragged_offset=offset, name=name))
    o, stats = g.sdpa(qkv[0], qkv[1], qkv[2], generate_stats=True, use_padding_mask=True, **lengths(g), name="sdpa")
    assert o is not None and stats is not None
    return qkv, o, stats


def finish(o: TensorSpec, stats: TensorSpec, g: cudnn.pygraph) -> None:
    o.set_output(True).set_dim([B, H, S, D]).set_stride(BSHD).set_ragged_offset(offsets(g, "O_offsets"))
    stats.set_output(True).set_ragged_offset(offsets(g, "Stats_offsets"))


def test_packed_tensors_are_declared_on_the_same_buffers() -> None:
    g = graph()
    (q, _, _), o, stats = ragged_sdpa(g)
    finish(o, stats, g)
    g.build([cudnn.heur_mode.A])
    assert q.dim == (1, H, B * S, D) and q.stride == (B * S * H * D, D, H * D, 1)
    assert o.dim == (1, H, B * S, D) and o.stride == (B * S * H * D, D, H * D, 1)
    assert stats.dim == (1, H, B * S, 1) and stats.stride == (B * S * H, 1, H, 1)  # THD when not given
    node = next(n for n in g.ir.nodes if n.op == "sdpa")
    assert node.attributes.max_seq_len_q == S  # type: ignore[attr-defined]
    tokens = node.input("RAGGED_OFFSET_Q")
    assert tokens is not None and tokens.data_type.value == "int32"


def run_sdpa(buffer_shape: tuple[int, ...]) -> np.ndarray:
    """O of a ragged sdpa whose Q, K, V, O buffers have ``buffer_shape``; two sequences of 3
    and 6 tokens (the second through the padded row of the first)."""
    g = graph()
    (q, k, v), o, stats = ragged_sdpa(g)
    finish(o, stats, g)
    g.build([cudnn.heur_mode.A])
    rng = np.random.default_rng(3)
    pack: dict[Any, Any] = {t: rng.standard_normal(buffer_shape).astype(np.float32) for t in (q, k, v)}
    out = np.zeros(buffer_shape, np.float32)
    element = np.array([0, 3, 9], np.int32).reshape(-1, 1, 1, 1) * H * D
    pack |= {o: out, stats: np.zeros((B * S, H, 1), np.float32)}
    pack |= {n: element for n in g.spec.tensors if n.name.endswith("_offsets") and n.name != "Stats_offsets"}
    pack |= {n: np.array([3, 6], np.int32).reshape(-1, 1, 1, 1) for n in g.spec.tensors if "seq_len" in n.name}
    g.execute(pack)
    return out.reshape(B * S, H, D)


def test_bshd_and_packed_thd_buffers_bind_alike() -> None:
    bshd = run_sdpa((B, S, H, D))
    np.testing.assert_array_equal(bshd, run_sdpa((B * S, H, D)))
    assert np.abs(bshd[:9]).min() > 0 and not bshd[9:].any()  # nine tokens written, the rest zero


def test_a_buffer_of_fewer_tokens_is_refused() -> None:
    g = graph()
    (q, _, _), o, stats = ragged_sdpa(g)
    finish(o, stats, g)
    g.build([cudnn.heur_mode.A])
    with pytest.raises(FeedError, match=r"'Q'.*do not lay out"):
        g.execute({q: np.zeros((9, H, D), np.float32)})


def test_the_token_division_compiles_for_sm_90_and_sm_80() -> None:
    for arch in (90, 80):
        g = cudnn.pygraph(
            io_data_type=cudnn.data_type.HALF,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            sm_version=arch,
        )
        _, o, stats = ragged_sdpa(g)
        finish(o, stats, g)
        g.build([cudnn.heur_mode.A])
        assert g._plan is not None
        division = [k for k in g._plan.kernels if "div" in k.name]  # type: ignore[attr-defined]
        assert len(division) == 2 and all(k.cubin for k in division)  # Q's and K's token offsets


def _bhsd(g: cudnn.pygraph) -> None:
    ragged_sdpa(g, {"Q": [H * S * D, S * D, D, 1]})


def _v_not_ragged(g: cudnn.pygraph) -> None:
    k = g.tensor(dim=[B, H, S, D], stride=BSHD, ragged_offset=offsets(g, "K_offsets"), name="K")
    q = g.tensor(dim=[B, H, S, D], stride=BSHD, ragged_offset=offsets(g, "Q_offsets"), name="Q")
    v = g.tensor(dim=[B, H, S, D], stride=BSHD, name="V")
    g.sdpa(q, k, v, use_padding_mask=True, **lengths(g))


def _k_not_ragged(g: cudnn.pygraph) -> None:
    q = g.tensor(dim=[B, H, S, D], stride=BSHD, name="Q")
    k = g.tensor(dim=[B, H, S, D], stride=BSHD, name="K")
    v = g.tensor(dim=[B, H, S, D], stride=BSHD, ragged_offset=offsets(g, "V_offsets"), name="V")
    g.sdpa(q, k, v, use_padding_mask=True, **lengths(g))


def _o_without_offsets(g: cudnn.pygraph) -> None:
    _, o, stats = ragged_sdpa(g)
    o.set_output(True).set_dim([B, H, S, D]).set_stride(BSHD)
    stats.set_output(True).set_ragged_offset(offsets(g, "Stats_offsets"))
    g.validate()


def _o_of_another_batch(g: cudnn.pygraph) -> None:
    _, o, stats = ragged_sdpa(g)
    finish(o, stats, g)
    o.set_dim([B + 1, H, S, D])
    g.validate()


def _shared_offsets_of_another_token_stride(g: cudnn.pygraph) -> None:
    ragged_sdpa(g, {"V": [S * 2 * H * D, 2 * D, 2 * H * D, 1]}, shared="kv")


def _float_offsets(g: cudnn.pygraph) -> None:
    q = g.tensor(dim=[B, H, S, D], stride=BSHD, ragged_offset=offsets(g, "Q_offsets", cudnn.data_type.FLOAT), name="Q")
    g.sdpa(q, q, q, use_padding_mask=True, **lengths(g))


def _ragged_relu_input(g: cudnn.pygraph) -> None:
    x = g.tensor(dim=[B, H, S, D], stride=BSHD, ragged_offset=offsets(g, "X_offsets"), name="X")
    g.relu(x).set_output(True)
    g.validate()


def _too_many_tokens(g: cudnn.pygraph) -> None:
    many = 1 << 20
    q = g.tensor(dim=[4, 1, many, 1], stride=[many, 1, 1, 1], ragged_offset=offsets(g, "Q_offsets"), name="Q")
    g.sdpa(q, q, q, use_padding_mask=True, **lengths(g))


def _max_total_without_ragged(g: cudnn.pygraph) -> None:
    x = g.tensor(dim=[B, H, S, D], stride=BSHD, name="X")
    stats = g.tensor(dim=[B, H, S, 1], data_type=cudnn.data_type.FLOAT, name="stats")
    g.sdpa_backward(x, x, x, x, x, stats, max_total_seq_len_kv=9)


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (_bhsd, UnsupportedError, "q 'Q' has strides .* not token-major"),
        (_v_not_ragged, UnsupportedError, "v 'V' has no ragged offset while k 'K' has"),
        (_k_not_ragged, UnsupportedError, "v 'V' has a ragged offset but k 'K' has none"),
        (_o_without_offsets, UnsupportedError, "O '.*' has no ragged offset while q 'Q' has"),
        (_o_of_another_batch, UnsupportedError, "B = 3 and S = 6, q 'Q' B = 2"),
        (_shared_offsets_of_another_token_stride, UnsupportedError, "v 'V' shares the ragged offset of k 'K'"),
        (_float_offsets, DataTypeError, "'Q_offsets' of q 'Q' is float"),
        (_ragged_relu_input, UnsupportedError, "'X' has the ragged offset 'X_offsets' but is no tensor of a ragged"),
        (_too_many_tokens, UnsupportedError, "holds 4194304 tokens"),
        (_max_total_without_ragged, UnsupportedError, "max_total_seq_len_kv=9: .* no ragged offsets"),
    ],
)
def test_what_cannot_be_translated_is_refused(
    build: Callable[[cudnn.pygraph], None], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        build(graph())
