"""Attention on the GPU against the reference: every case of attention_cases.py, each flash
launch choice, and the rows that see no key (O = 0, STATS = -inf exactly)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import graphdnn as gd
from codegen.emit import candidates
from fusion_rules import Family, fuse
from graphdnn import reference
from graphdnn.arch import sm_count
from graphdnn.dtypes import DataType
from graphdnn.random_inputs import random_inputs
from graphdnn.runtime.driver import current_gpu_arch
from tests.attention_cases import CASES, AttentionCase, self_attention
from tests.gpu_check import check_on_gpu, poisoned, relative_error, to_device, to_numpy
from tests.test_codegen_attention import WGMMA_CASES

# Many key tiles through the two-stage ring, GQA, causal skipping, rows past the last block.
HOPPER_CASES = {
    "long_causal_gqa": AttentionCase(
        b=2, hq=8, hk=2, sq=1000, skv=1000, d=128, dv=128, options={"use_causal_mask": True}
    ),
}
# More work items (128-row blocks x heads x batch) than an H100 has SMs: a persistent block
# walks several, light and heavy, some with no visible key, by TMA and by cp.async.
PERSISTENT_CASES = {
    "items_causal_gqa": AttentionCase(
        b=2, hq=16, hk=4, sq=1000, skv=1000, d=128, dv=128, options={"use_causal_mask": True}
    ),
    "items_padded_empty_sequences": AttentionCase(b=4, hq=8, hk=8, sq=520, skv=300, padding=True),
    "items_kv_shared_across_batch": AttentionCase(b=4, hq=8, hk=2, sq=600, skv=333, layout="shared_kv"),
}

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_matches_reference(case: str) -> None:
    check_on_gpu(CASES[case].build(), seed=zlib.crc32(case.encode()))


@pytest.mark.parametrize(
    "case", ["gqa_4to1_causal", "d128_bshd", "d256_fp16", "padding_causal_bottom_right", "dropout_half_gqa"]
)
def test_every_flash_choice_matches_reference(case: str) -> None:
    graph = CASES[case].build()
    ir = graph.validate()
    (fused,) = [f for f in fuse(ir).nodes if f.family is Family.ATTENTION]
    for choice in candidates(fused, 90):
        check_on_gpu(graph, seed=zlib.crc32(case.encode()), tuning={fused.name: choice})


@pytest.mark.parametrize("case", [*WGMMA_CASES, "long_causal_gqa"])
def test_the_hopper_kernel_matches_reference(case: str) -> None:
    if current_gpu_arch() != 90:
        pytest.skip("the wgmma attention kernel runs on sm_90 GPUs only")
    graph = (CASES | HOPPER_CASES)[case].build()
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION]
    plan = check_on_gpu(graph, seed=zlib.crc32(case.encode()), tuning={fused.name: {"path": "wgmma"}})
    assert any("_wgmma_" in kernel.name for kernel in plan.kernels)


def test_every_hopper_choice_over_many_key_tiles() -> None:
    """Keys per stage and the consumers' turn-taking, through many tiles of the ring."""
    if current_gpu_arch() != 90:
        pytest.skip("the wgmma attention kernel runs on sm_90 GPUs only")
    graph = HOPPER_CASES["long_causal_gqa"].build()
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION]
    choices = [c for c in candidates(fused, 90) if c.get("path") == "wgmma"]
    assert len(choices) == 8
    for choice in choices:
        check_on_gpu(graph, seed=7, tuning={fused.name: choice})


@pytest.mark.parametrize("case", sorted(PERSISTENT_CASES))
def test_persistent_hopper_blocks_walk_many_work_items(case: str) -> None:
    if current_gpu_arch() != 90:
        pytest.skip("the wgmma attention kernel runs on sm_90 GPUs only")
    c = PERSISTENT_CASES[case]
    graph = c.build()
    (fused,) = [f for f in fuse(graph.validate()).nodes if f.family is Family.ATTENTION]
    for choice in (o for o in candidates(fused, 90) if o.get("path") == "wgmma" and o["persistent"]):
        plan = check_on_gpu(graph, seed=zlib.crc32(case.encode()), tuning={fused.name: choice})
        (launch,) = plan.program.launches
        assert launch.grid[0] == sm_count(90) < -(-c.sq // 128) * c.hq * c.b, choice


def test_the_hopper_kernel_reads_rows_that_are_not_16_byte_aligned() -> None:
    """Q, K and V start 2 bytes into their buffers: binding copies them to aligned buffers for
    the tensor maps."""
    import torch

    if current_gpu_arch() != 90:
        pytest.skip("the wgmma attention kernel runs on sm_90 GPUs only")
    case = AttentionCase(b=2, hq=4, hk=2, sq=150, skv=200, d=64, dv=64, options={"use_causal_mask": True})
    graph = case.build()
    ir = graph.validate()
    (fused,) = [f for f in fuse(ir).nodes if f.family is Family.ATTENTION]
    feeds = random_inputs(ir, 3)
    expected = reference.execute(ir, feeds)
    pack = {}
    for t in ir.inputs:
        if t.is_pass_by_value:
            pack[t.name] = feeds[t.name]
            continue
        aligned = to_device(feeds[t.name], t)
        storage = torch.empty(aligned.untyped_storage().nbytes() // 2 + 8, dtype=aligned.dtype, device="cuda")
        view = storage[1:].as_strided(aligned.shape, aligned.stride())
        view.copy_(aligned)
        assert view.data_ptr() % 16 == 2
        pack[t.name] = view
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    plan = gd.compile(graph, tuning={fused.name: {"path": "wgmma"}})
    plan.execute({**pack, **outputs})
    torch.cuda.synchronize()
    for t in ir.outputs:
        assert relative_error(to_numpy(outputs[t.name]), expected[t.name]) < 2e-2, t.name


@pytest.mark.parametrize("data_type", [DataType.BFLOAT16, DataType.FLOAT])
def test_one_tensor_as_query_key_and_value(data_type: DataType) -> None:
    check_on_gpu(self_attention(data_type))


def test_rows_without_visible_keys_are_zero_with_minus_infinite_stats() -> None:
    import torch

    case = AttentionCase(b=3, sq=70, skv=40, padding=True, options={"use_causal_mask_bottom_right": True})
    ir = case.build().validate()
    feeds = random_inputs(ir, 5)
    feeds["seq_q"] = np.array([70, 0, 13], dtype=np.int32).reshape(3, 1, 1, 1)
    feeds["seq_kv"] = np.array([5, 40, 0], dtype=np.int32).reshape(3, 1, 1, 1)
    expected = reference.execute(ir, feeds)
    plan = gd.compile(ir)
    outputs = {t.name: poisoned(t) for t in ir.outputs}
    plan.execute({**{t.name: to_device(feeds[t.name], t) for t in ir.inputs}, **outputs})
    torch.cuda.synchronize()
    stats, want = to_numpy(outputs["stats"]), expected["stats"]
    empty = np.isneginf(want)
    assert empty.any() and (~empty).any()
    assert np.array_equal(np.isneginf(stats), empty)
    np.testing.assert_allclose(stats[~empty], want[~empty], rtol=1e-4, atol=1e-4)
    o = to_numpy(outputs["o"])
    assert (o[np.broadcast_to(empty, o.shape)] == 0).all()
    np.testing.assert_allclose(o, expected["o"], atol=3e-2)


@pytest.mark.parametrize("k_form", ["strides", "transpose", "bshd"])
@pytest.mark.parametrize("kv_heads", [1, 4])
def test_attention_written_from_primitives_runs_as_one_attention_kernel(k_form: str, kv_heads: int) -> None:
    """One flash kernel: mma.sync, or on sm_90 the wgmma one (head dim 64 takes it)."""
    from tests.test_fusion_attention_rule import Form

    form = Form(b=2, h=4, hk=kv_heads, sq=100, skv=130, d=64, dv=64, k_form=k_form, bias=(2, 1, 1, 130), io="bf16")
    plan = check_on_gpu(form.build(), seed=kv_heads)
    (kernel,) = plan.kernels
    assert "_flash_" in kernel.name or "_wgmma_" in kernel.name


@pytest.mark.parametrize("sq", [1, 70])  # the decode kernel, the flash ones
def test_a_window_wider_than_every_key_matches_reference(sq: int) -> None:
    case = AttentionCase(sq=sq, skv=90, options={"use_causal_mask": True, "sliding_window_length": 2**32})
    check_on_gpu(case.build(), seed=sq)
