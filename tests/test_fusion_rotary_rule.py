"""The ``rotary_attention`` rule: RoPE written from primitives on sdpa's Q and/or K folds into the
attention node, whose anchor (sdpa with RotarySdpaAttributes) computes what the unfused graph
computes; near misses stay unfused, with the reason logged, and still compute the same. The
kernels' program: the RoPE pre-pass, then the attention kernel reading its scratch."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphdnn as gd
from fusion_rules import Family, Partition, fuse
from fusion_rules.partition_reference import execute_partition
from graphdnn import reference
from graphdnn.cache.plan_cache import PlanCache
from graphdnn.compare import relative_error
from graphdnn.compilation import Compilation
from graphdnn.dtypes import DataType
from graphdnn.lower import lower
from graphdnn.ops.attention import RotarySdpaAttributes
from graphdnn.ops.rotary import rotate_half
from graphdnn.program import ArgKind
from graphdnn.random_inputs import random_inputs
from tests.rotary_cases import TABLES, RopeForm, RotaryCase
from tests.test_cpu_emulation import check
from tests.test_fusion_property import check_partition

FLASH = {"warps": 4, "block_n": 64, "m_tiles": 1}
FUSED = {
    "q_and_k": RotaryCase(),
    "q_only_fp16": RotaryCase(k=None, data_type=DataType.HALF),
    "k_only_gqa": RotaryCase(hq=4, hk=1, sq=9, skv=23, q=None),
    "negated_swap_theta_500k": RotaryCase(q=RopeForm(500000.0, negated=True), k=RopeForm(500000.0, negated=True)),
    "decode_d128": RotaryCase(sq=1, skv=40, d=128, options={}),
    "float_d2": RotaryCase(d=2, data_type=DataType.FLOAT, options={}),
    "tables_q_and_k": RotaryCase(q=TABLES, k=TABLES),
    "tables_decode_2d": RotaryCase(sq=1, skv=30, q=dataclasses.replace(TABLES, tables=2), k=TABLES, options={}),
    "tables_unsigned_swap_k_only": RotaryCase(q=None, k=RopeForm(tables=4)),
}


def _rotary(partition: Partition) -> RotarySdpaAttributes:
    (fused,) = [f for f in partition.nodes if f.family is Family.ATTENTION]
    assert fused.rule == "rotary_attention" and fused.anchor is not None
    attrs = fused.anchor.attributes
    assert isinstance(attrs, RotarySdpaAttributes)
    return attrs


def _same_as_unfused(partition: Partition, seed: int = 0) -> None:
    check_partition(partition)
    ir = partition.graph
    feeds = random_inputs(ir, seed)
    want = reference.execute(ir, feeds)["o"]
    got = execute_partition(partition, feeds)["o"]
    # the unfused graph rounds its float factors, the anchor computes RoPE in float64: both round
    # the rotated operand to its type, which rarely differs by one unit
    assert relative_error(got, want) < 2e-3


@pytest.mark.parametrize("case", sorted(FUSED))
def test_rope_folds_into_the_attention_node(case: str) -> None:
    c = FUSED[case]
    partition = fuse(c.build().validate())
    assert len(partition.nodes) == 1
    attrs = _rotary(partition)
    assert (attrs.rotary_q, attrs.rotary_k) == (c.q is not None, c.k is not None)
    form = c.q or c.k
    assert form is not None
    if c.d >= 4 and max(c.sq, c.skv) > 1 and not form.tables:  # else any theta is the same rotation
        assert attrs.rotary_theta == form.theta
    anchor = partition.nodes[0].anchor
    assert anchor is not None
    assert [anchor.input(role).name for role in ("Q", "K", "V")] == ["q", "k", "v"]  # type: ignore[union-attr]
    tables = {role: t.name for role, t in anchor.inputs if role.startswith("ROPE_")}  # type: ignore[union-attr]
    expected = {
        f"ROPE_{f.upper()}_{r}": f"{r.lower()}_rope.{f}"
        for r, o in (("Q", c.q), ("K", c.k))
        if o and o.tables
        for f in ("cos", "sin")
    }
    assert tables == expected
    if form.tables:
        assert attrs.rotary_negated == form.negated
    _same_as_unfused(partition)


def test_the_rotation_is_rope() -> None:
    """Pairs (d, d + D/2) turn by s theta^(-2i/D): the complex product (x1 + i x2) e^(i angle)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 11, 8))
    y = rotate_half(x, 100.0)
    angles = np.arange(11)[:, None] * 100.0 ** (-np.arange(4) / 4.0)
    turned = (x[..., :4] + 1j * x[..., 4:]) * np.exp(1j * angles)
    np.testing.assert_allclose(y, np.concatenate([turned.real, turned.imag], axis=-1), atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1))  # a rotation


NEAR_MISSES = {
    "bfloat16_factors": (RotaryCase(q=RopeForm(factor_type=DataType.BFLOAT16), k=None), "is not RoPE's"),
    "halves_not_swapped": (RotaryCase(q=RopeForm(swap=(0, 1)), k=None), "in the wrong places"),
    "positions_along_heads": (RotaryCase(q=RopeForm(position_axis=1), k=None), "indexes axis 1"),
    "thetas_differ": (RotaryCase(q=RopeForm(theta=10000.0), k=RopeForm(theta=500000.0)), "takes one theta"),
    "tables_differ_in_sign": (RotaryCase(q=TABLES, k=RopeForm(tables=4)), "different signs"),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_a_near_miss_stays_unfused_and_says_why(case: str) -> None:
    c, reason = NEAR_MISSES[case]
    partition = fuse(c.build().validate())
    assert all(f.rule != "rotary_attention" for f in partition.nodes)
    reasons = [r.reason for r in partition.rejections if r.rule == "rotary_attention"]
    assert any(reason in r for r in reasons), reasons
    _same_as_unfused(partition)


def test_a_rope_output_written_to_memory_stays_unfused() -> None:
    partition = fuse(RotaryCase(k=None, expose_q_rope=True).build().validate())
    assert all(f.rule != "rotary_attention" for f in partition.nodes)
    reasons = [r.reason for r in partition.rejections if r.rule == "rotary_attention"]
    assert any("is a graph output" in r for r in reasons), reasons


def test_the_llama_example_folds_rope_into_attention() -> None:
    path = Path(__file__).resolve().parent.parent / "examples" / "build_graphs.py"
    spec = importlib.util.spec_from_file_location("build_graphs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    partition = fuse(module.llama_layer().validate())
    attrs = _rotary(partition)
    assert attrs.rotary_q and attrs.rotary_k and attrs.rotary_theta == 10000.0
    assert not any(
        n.op in ("slice", "concatenate", "sin", "cos")
        for f in partition.nodes
        if f.family is not Family.ATTENTION
        for n in f.nodes
    )


@pytest.mark.parametrize("arch", [80, 90])
def test_the_kernel_rotates_q_and_the_pre_pass_k(arch: int) -> None:
    """The flash (sm_80) and Hopper (sm_90) kernels rotate their Q tile in shared memory; K is
    rotated once, by the pre-pass, into scratch that the attention kernel reads."""
    ir = RotaryCase(hq=4, hk=2, sq=70, skv=70, d=128).build().validate()
    job = Compilation.of(ir, arch)
    lowered = lower(job.partition, job.target, job.signature, job.fields.kernel_key)
    names = [launch.name for launch in lowered.program.launches]
    assert "rope_prepass" in names[0] and len(names) == 2
    attention = next(s for s in lowered.sources.values() if s.name == names[1])
    assert "RoPE on Q (theta 10000)" in attention.source and "rotary_k" in attention.source
    assert ("_wgmma_" in names[1]) == (arch == 90)
    if arch == 90:  # the Hopper kernel reads the rotated K by a TMA map of the scratch
        assert "tm_rotary_k" in attention.source
    (scratch,) = [b for b in lowered.program.workspace if b.scratch is not None]
    assert scratch.scratch == "rotary_k" and scratch.bytes >= 2 * 2 * 70 * 128 * 2


def test_rope_on_q_alone_needs_no_pre_pass() -> None:
    ir = RotaryCase(k=None).build().validate()
    job = Compilation.of(ir, 90)
    lowered = lower(job.partition, job.target, job.signature, job.fields.kernel_key)
    assert [launch.name for launch in lowered.program.launches if "rope" in launch.name] == []
    assert not [b for b in lowered.program.workspace if b.scratch is not None]


def test_the_tensor_core_decode_kernel_rotates_q_and_k_itself() -> None:
    ir = RotaryCase(sq=1, skv=40, d=128).build().validate()
    job = Compilation.of(ir, 90)
    lowered = lower(job.partition, job.target, job.signature, job.fields.kernel_key)
    (source,) = lowered.sources.values()
    assert "_decode_mma_" in source.name and "RoPE on Q (theta 10000)" in source.source
    assert "RoPE on K (theta 10000)" in source.source
    assert not [b for b in lowered.program.workspace if b.scratch is not None]


@pytest.mark.parametrize(
    ("case", "tuning"),
    [(RotaryCase(sq=1, skv=40, d=128), {"path": "decode"}), (RotaryCase(data_type=DataType.FLOAT), {})],
    ids=["cuda_core_decode", "simt"],
)
def test_the_other_kernels_read_both_from_the_pre_pass(case: RotaryCase, tuning: dict[str, object]) -> None:
    ir = case.build().validate()
    job = Compilation.of(ir, 90)
    (fused,) = job.partition.nodes
    lowered = lower(job.partition, job.target, job.signature, job.fields.kernel_key, tuning={0: tuning})
    assert sorted(b.scratch for b in lowered.program.workspace if b.scratch is not None) == ["rotary_k", "rotary_q"]
    assert not any("RoPE on" in s.source for s in lowered.sources.values())
    assert fused.rule == "rotary_attention"


def test_only_the_rule_binds_rope_tables() -> None:
    g = gd.OperationGraphSpec(io_data_type="half")
    q, k, v, cos = (g.tensor([1, 2, 8, 16], name=n) for n in ("q", "k", "v", "cos"))
    with pytest.raises(gd.StructureError, match="only the rotary_attention fusion rule binds them"):
        g._add_node("sdpa", {"Q": q, "K": k, "V": v, "ROPE_COS_Q": cos}, {})


def test_a_plain_sdpa_keeps_its_attributes() -> None:
    partition = fuse(dataclasses.replace(RotaryCase(), q=None, k=None).build().validate())
    (fused,) = partition.nodes
    assert fused.rule == "single" and not isinstance(fused.anchor.attributes, RotarySdpaAttributes)  # type: ignore[union-attr]


def test_scratch_tensor_maps_survive_the_plan_cache(tmp_path: Path) -> None:
    """The Hopper kernel's maps of the rotated operands name scratch, not tensors: a stored plan
    passes the cache's checks and binds them to the scratch buffers' offsets."""
    graph = RotaryCase(sq=70, skv=70, d=128).build()
    gd.compile(graph, arch=90, cache=PlanCache(tmp_path))
    plan = gd.compile(graph, arch=90, cache=PlanCache(tmp_path), require_cached=True)
    maps = [a for launch in plan.program.launches for a in launch.args if a.kind is ArgKind.TENSOR_MAP]
    on_scratch = [a.offset for a in maps if a.tensor is None]
    assert on_scratch == [b.offset for b in plan.program.workspace if b.scratch is not None]  # K's
    assert len(maps) == 3  # and Q's and V's, of the graph's tensors


EMULATED = {  # the flash kernel (fp16 mma.sync) rotating Q in its prologue, after the pre-pass rotating K
    "flash_fp16_gqa_causal": (RotaryCase(hq=4, hk=2, sq=37, skv=37, d=64, data_type=DataType.HALF), FLASH),
    "decode_mma_fp16_gqa": (RotaryCase(b=2, hq=4, hk=1, sq=1, skv=70, d=64, data_type=DataType.HALF, options={}), {}),
    "decode_mma_fp16_two_rows_d96": (
        RotaryCase(
            b=1, hq=2, hk=1, sq=2, skv=45, d=96, data_type=DataType.HALF, options={"use_causal_mask_bottom_right": True}
        ),
        {},
    ),
    "flash_fp16_tables": (
        RotaryCase(
            hq=2, hk=2, sq=21, skv=21, d=32, data_type=DataType.HALF, q=TABLES, k=dataclasses.replace(TABLES, tables=2)
        ),
        FLASH,
    ),
    "flash_fp16_q_only_bottom_right": (
        RotaryCase(
            hq=2,
            hk=1,
            sq=20,
            skv=45,
            d=32,
            data_type=DataType.HALF,
            k=None,
            options={"use_causal_mask_bottom_right": True},
        ),
        FLASH,
    ),
}


@pytest.mark.parametrize("case", sorted(EMULATED))
def test_the_kernels_match_the_reference_on_the_cpu(case: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    case_graph, tuning = EMULATED[case]
    graph = case_graph.build()
    _rotary(fuse(graph.validate()))
    check(graph, tuning, tmp_path_factory)


@st.composite
def rotary_cases(draw: st.DrawFn) -> RotaryCase:
    """Random shapes (GQA groups, odd lengths, even head dims), thetas and forms of RoPE on Q, K or both."""
    kv_heads = draw(st.integers(1, 3))

    def form() -> RopeForm | None:
        tables = draw(st.sampled_from([0, 0, 2, 4]))
        negated = draw(st.booleans())
        theta = draw(st.sampled_from([100.0, 10000.0, 500000.0]))
        return RopeForm(theta=theta, negated=negated, tables=tables)

    q, k = draw(st.sampled_from([(True, True), (True, False), (False, True)]))
    q_form, k_form = form() if q else None, form() if k else None
    if q_form and k_form:  # one theta and, between tables, one sign: else the rule refuses (tested above)
        k_form = dataclasses.replace(k_form, theta=q_form.theta, negated=q_form.negated)
    data_type = draw(st.sampled_from([DataType.FLOAT, DataType.HALF, DataType.BFLOAT16]))
    return RotaryCase(
        b=draw(st.integers(1, 2)),
        hq=kv_heads * draw(st.integers(1, 3)),
        hk=kv_heads,
        sq=draw(st.integers(1, 19)),
        skv=draw(st.integers(1, 23)),
        d=draw(st.sampled_from([2, 4, 8, 16, 32])),
        data_type=data_type,
        q=q_form,
        k=k_form,
        options=draw(st.sampled_from([{}, {"use_causal_mask": True}, {"use_causal_mask_bottom_right": True}])),
    )


@pytest.mark.compile_sample
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=rotary_cases(), seed=st.integers(0, 2**16))
def test_random_forms_fold_and_compute_what_the_unfused_graph_computes(case: RotaryCase, seed: int) -> None:
    partition = fuse(case.build().validate())
    attrs = _rotary(partition)
    assert (attrs.rotary_q, attrs.rotary_k) == (case.q is not None, case.k is not None)
    _same_as_unfused(partition, seed)
