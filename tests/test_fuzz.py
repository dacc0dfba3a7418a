"""The structural fuzzer in CI: mutated graphs fail with a GraphError or build and run.

A bounded campaign (seeded, so a failure reproduces with the one-line command it
prints) reads, lowers for sm_90 (fusion + CUDA emission) and runs on the reference
every mutated graph, and compiles a seeded sample of the distinct kernels with NVRTC.
``GRAPHDNN_FUZZ=full`` runs a campaign ten times larger and compiles every distinct
kernel (minutes); ``python -m tests.graph_fuzz --cases N`` runs any campaign by hand.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

from tests import graph_fuzz

FULL = os.environ.get("GRAPHDNN_FUZZ", "") == "full"
CASES = 30_000 if FULL else 3_000
COMPILE_SAMPLE = None if FULL else 16


@pytest.fixture(scope="module")
def campaign() -> graph_fuzz.Report:
    return graph_fuzz.run(seed=0, cases=range(CASES), compile_sample=COMPILE_SAMPLE)


def test_the_seed_corpus_holds_the_examples_the_test_graphs_and_the_recipes() -> None:
    kinds = Counter(name.split("[")[0].split(".")[0].split("/")[0] for name, _ in graph_fuzz.corpus())
    assert kinds["examples"] == len(list(graph_fuzz.EXAMPLES.glob("*.json"))) >= 4
    assert kinds["plan_graphs"] >= 5
    assert kinds["pointwise_recipe"] >= 20 and kinds["fusion_recipe"] >= 30
    assert kinds["attention_recipe"] >= 10


@pytest.mark.compile_sample
def test_mutated_graphs_fail_only_with_graph_errors_and_otherwise_lower_and_run(
    campaign: graph_fuzz.Report,
) -> None:
    findings = "\n\n".join(f for f in campaign.findings if not f.startswith(f"seed {campaign.seed}: NVRTC"))
    assert not findings, f"{campaign.summary()}\n{findings}"
    # Both outcomes are common, so the campaign tests the checks and the backends alike.
    assert campaign.counts["rejected"] > CASES // 10, campaign.summary()
    assert campaign.counts["accepted"] > CASES // 10, campaign.summary()
    assert len(campaign.kernels) > 100, campaign.summary()


def test_the_fuzzed_kernels_compile_for_sm_90(campaign: graph_fuzz.Report) -> None:
    failures = "\n\n".join(f for f in campaign.findings if f.startswith(f"seed {campaign.seed}: NVRTC"))
    assert campaign.compiled == (len(campaign.kernels) if FULL else COMPILE_SAMPLE)
    assert not failures, f"{campaign.summary()}\n{failures}"


def test_a_case_is_the_same_whatever_ran_before() -> None:
    assert graph_fuzz.make_case(7, 123) == graph_fuzz.make_case(7, 123)
    assert graph_fuzz.make_case(7, 123) != graph_fuzz.make_case(7, 124)


def test_the_shrunk_examples_keep_their_layouts() -> None:
    doc = {"tensors": [{"dim": [32, 64, 56, 56], "stride": [200704, 1, 3584, 64]}]}
    assert graph_fuzz.shrink(doc)["tensors"][0] == {"dim": [2, 4, 5, 5], "stride": [100, 1, 20, 4]}
