"""A seeded structural fuzzer: mutated graph JSON must fail with a GraphError or work.

Seeds are the example graphs (examples/graphs/*.json, shrunk to small dims so the
reference runs in milliseconds), the small graphs the plan tests build, and graphs drawn
from the recipes of tests/graph_strategies.py (pointwise, fusion and attention). Each
case applies one to three structural mutations (types, ids, dims, strides, data types,
cycles, dangling references, attribute values, names, inserted and deleted nodes) to one
seed's JSON document, then:

- reading it (``OperationGraphSpec.from_json``) either raises a :class:`graphdnn.GraphError` or gives
  a valid graph;
- a valid graph lowers for sm_90 (fusion and CUDA emission) and runs on the reference
  backend with random inputs, again failing only with a GraphError where it is refused;
- its kernels compile with NVRTC: every distinct kernel (by content hash) where asked,
  else a bounded seeded sample (compiling is what takes time).

Anything else is a finding. Case ``n`` of seed ``s`` depends on nothing else, so a
finding reproduces with ``python -m tests.graph_fuzz --seed s --case n``; a campaign is
``python -m tests.graph_fuzz --seed s --cases 100000``.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings

import graphdnn as gd
from fusion_rules import fuse
from graphdnn.dtypes import DataType
from graphdnn.layout import numel, packed_strides, stride_order
from graphdnn.lower import KernelSource, lower
from graphdnn.ops.base import get_op, op_kinds
from graphdnn.random_inputs import random_inputs
from graphdnn.reference_plan import ReferencePlan, host_array
from graphdnn.serialize import graph_to_dict
from graphdnn.signature import signature
from tests import plan_graphs
from tests.graph_strategies import attention_recipes, build, fusion_recipes, pointwise_recipes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "graphs"
# The example graphs' large dims, mapped to small ones that keep every graph valid.
SMALL_DIMS = {32: 2, 56: 5, 64: 4, 256: 8, 2048: 6, 1024: 4, 4096: 16}
# Skip the reference run above this many elements over all tensors (a mutation that
# makes a valid graph big is still lowered; only running it would be slow).
REFERENCE_BUDGET = 1 << 18
# Integers that probe bounds: zero, negatives, the int32/int64 edges, huge strides.
INTEGERS = [0, 1, -1, 2, 3, 5, 7, 8, 2**31 - 1, 2**31, 2**32, 2**40, 2**48, 2**62, 2**63, -(2**63), 2**70]
ODD_VALUES: list[Any] = [None, True, 1.5, float("nan"), "3", "", [], {}, [1, 2], {"a": 1}]
DATA_TYPES = [t.value for t in DataType] + ["bf16", "fp32", "float128", "", "FLOAT"]
NAMES = ["", "x", "a" * 300, "tab\there", "new\nline", "nul\0", "del\x7f", "é", "::", "y"]


@dataclass
class Outcome:
    """What one case did: 'rejected' (a GraphError), 'accepted', or 'finding'."""

    status: str
    detail: str = ""
    sources: dict[str, KernelSource] = field(default_factory=dict)  # by content hash


# -- the seed corpus -------------------------------------------------------------------------
@cache
def corpus() -> tuple[tuple[str, str], ...]:
    """(name, JSON text) of every seed graph; each one is valid."""
    seeds: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(EXAMPLES.glob("*.json")):
        seeds.append((f"examples/{path.stem}", shrink(json.loads(path.read_text()))))
    for builder in (
        plan_graphs.add_relu,
        plan_graphs.add_relu_and_sigmoid,
        plan_graphs.scaled,
        plan_graphs.sum_then_add,
        plan_graphs.matmul_relu,
    ):
        seeds.append((f"plan_graphs.{builder.__name__}", graph_to_dict(builder().validate())))
    recipes = (
        ("pointwise", pointwise_recipes(), 24),
        ("fusion", fusion_recipes(), 40),
        ("attention", attention_recipes(), 12),
    )
    for kind, strategy, count in recipes:
        for index, recipe in enumerate(_drawn(strategy, count)):
            seeds.append((f"{kind}_recipe[{index}]", graph_to_dict(build(recipe)[0].validate())))
    texts = tuple((name, json.dumps(doc)) for name, doc in seeds)
    for _, text in texts:
        gd.OperationGraphSpec.from_json(text)  # a seed that does not validate would make every case a rejection
    return texts


def shrink(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with the large dims of SMALL_DIMS made small, strides repacked in the same order."""
    for t in doc["tensors"]:
        order = stride_order(t["dim"], t["stride"])
        t["dim"] = [SMALL_DIMS.get(d, d) for d in t["dim"]]
        t["stride"] = list(packed_strides(t["dim"], order))
    return doc


def _drawn(strategy: Any, count: int) -> list[Any]:
    """``count`` values of a hypothesis strategy, the same ones on every run."""
    found: list[Any] = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(value: Any) -> None:
        found.append(value)

    collect()
    return found[:count]


# -- mutations -------------------------------------------------------------------------------
Mutation = Callable[[dict[str, Any], random.Random], str]


def _pick(rng: random.Random, items: list[Any]) -> Any:
    return items[rng.randrange(len(items))] if items else None


def _integer(rng: random.Random, near: Any = None) -> Any:
    """A nearby integer, a bound-probing one, or something that is not an integer at all."""
    roll = rng.random()
    if isinstance(near, int) and not isinstance(near, bool) and roll < 0.5:
        return max(near + rng.choice([-2, -1, 1, 2, near, -near]), rng.choice([0, 1]))
    if roll < 0.9:
        return rng.choice(INTEGERS)
    return rng.choice(ODD_VALUES)


def _tensor_ids(doc: dict[str, Any]) -> list[Any]:
    return [t.get("id") for t in doc["tensors"] if isinstance(t, dict)]


def _reference(doc: dict[str, Any], rng: random.Random) -> Any:
    """A tensor id to bind: an existing one mostly, else dangling or not an id."""
    roll = rng.random()
    if roll < 0.85:
        return _pick(rng, _tensor_ids(doc))
    if roll < 0.95:
        return max([i for i in _tensor_ids(doc) if isinstance(i, int)], default=0) + rng.randint(1, 3)
    return rng.choice([-1, 2**31, "0", None, 1.0, [0]])


def mutate_dim(doc: dict[str, Any], rng: random.Random) -> str:
    t = _pick(rng, doc["tensors"])
    dim = t.get("dim")
    if not isinstance(dim, list) or not dim:
        return "dim: none"
    roll = rng.random()
    if roll < 0.15:
        dim.append(rng.choice([1, 2]))
        return f"dim: append to {t.get('name')}"
    if roll < 0.25:
        dim.pop(rng.randrange(len(dim)))
        return f"dim: drop from {t.get('name')}"
    axis = rng.randrange(len(dim))
    dim[axis] = _integer(rng, dim[axis])
    return f"dim: {t.get('name')}[{axis}] = {dim[axis]!r}"


def mutate_stride(doc: dict[str, Any], rng: random.Random) -> str:
    t = _pick(rng, doc["tensors"])
    stride = t.get("stride")
    if not isinstance(stride, list) or not stride:
        return "stride: none"
    roll = rng.random()
    if roll < 0.15:
        t.pop("stride")
        return f"stride: drop {t.get('name')}'s"
    if roll < 0.35 and isinstance(t.get("dim"), list) and len(t["dim"]) == len(stride):
        order = list(range(len(stride)))
        rng.shuffle(order)
        t["stride"] = list(packed_strides([max(int(d), 1) for d in t["dim"]], order))
        return f"stride: {t.get('name')} packed in order {order}"
    axis = rng.randrange(len(stride))
    stride[axis] = rng.choice([2**31, 2**40, 2**48, 2**31 - 1]) if roll < 0.6 else _integer(rng, stride[axis])
    return f"stride: {t.get('name')}[{axis}] = {stride[axis]!r}"


def mutate_data_type(doc: dict[str, Any], rng: random.Random) -> str:
    roll = rng.random()
    value = rng.choice(DATA_TYPES) if rng.random() < 0.95 else rng.choice(ODD_VALUES)
    if roll < 0.6:
        t = _pick(rng, doc["tensors"])
        t["data_type"] = value
        return f"data_type: {t.get('name')} = {value!r}"
    if roll < 0.8:
        node = _pick(rng, doc["nodes"])
        if node is None:
            return "data_type: none"
        node["compute_data_type"] = value
        return f"compute_data_type: {node.get('name')} = {value!r}"
    key = rng.choice(["io_data_type", "intermediate_data_type", "compute_data_type"])
    doc[key] = value
    return f"{key} = {value!r}"


def mutate_tensor_flag(doc: dict[str, Any], rng: random.Random) -> str:
    t = _pick(rng, doc["tensors"])
    key = rng.choice(["is_virtual", "is_virtual", "is_pass_by_value", "value", "uid", "uid"])
    if key == "value":
        t["value"] = rng.choice([0.0, -1.5, 1e300, 3, True, "1"])
    elif key == "uid":
        uids = [u.get("uid") for u in doc["tensors"] if u.get("uid") is not None]
        t["uid"] = _pick(rng, uids) if uids and rng.random() < 0.5 else _integer(rng)
    else:
        t[key] = not t.get(key, False) if rng.random() < 0.9 else rng.choice(ODD_VALUES)
    return f"{key}: {t.get('name')} = {t[key]!r}"


def mutate_id(doc: dict[str, Any], rng: random.Random) -> str:
    t = _pick(rng, doc["tensors"])
    t["id"] = _pick(rng, _tensor_ids(doc)) if rng.random() < 0.5 else _integer(rng, t.get("id"))
    return f"id: {t.get('name')} = {t['id']!r}"


def mutate_name(doc: dict[str, Any], rng: random.Random) -> str:
    entry = _pick(rng, doc["tensors"] + doc["nodes"])
    others = [e.get("name") for e in doc["tensors"] + doc["nodes"] if e.get("name")]
    entry["name"] = _pick(rng, others) if rng.random() < 0.4 else rng.choice([*NAMES, *ODD_VALUES])
    return f"name = {entry['name']!r}"


def mutate_binding(doc: dict[str, Any], rng: random.Random) -> str:
    """Rewire an input or output (cycles, dangling ids, tensors written twice), drop or add a role."""
    node = _pick(rng, doc["nodes"])
    if node is None:
        return "binding: none"
    side = rng.choice(["inputs", "inputs", "outputs"])
    bound = node.get(side)
    if not isinstance(bound, dict):
        return "binding: none"
    roll = rng.random()
    if roll < 0.15 and bound:
        role = rng.choice(sorted(bound))
        bound.pop(role)
        return f"{side}: {node.get('name')} drops {role}"
    if roll < 0.3:
        roles = [*_roles(node.get("op"), side), "bogus"]
        role = rng.choice(roles)
        bound[role] = _reference(doc, rng)
        return f"{side}: {node.get('name')}.{role} = {bound[role]!r}"
    if not bound:
        return "binding: none"
    role = rng.choice(sorted(bound))
    value = bound[role]
    if isinstance(value, list) and value:
        index = rng.randrange(len(value))
        value[index] = _reference(doc, rng)
        if rng.random() < 0.2:
            value.append(_reference(doc, rng))
    else:
        bound[role] = _reference(doc, rng) if rng.random() < 0.95 else rng.choice([[0], [], {}])
    return f"{side}: {node.get('name')}.{role} = {bound[role]!r}"


def rewire_compatible(doc: dict[str, Any], rng: random.Random) -> str:
    """Rebind an input to another tensor of the same dims, or of dims that broadcast to them
    (another node's output or statistic, an output of the same node, a graph input): mostly
    valid graphs with new wiring, sometimes cycles."""
    node = _pick(rng, doc["nodes"])
    if node is None or not isinstance(node.get("inputs"), dict) or not node["inputs"]:
        return "rewire: none"
    by_id = {t.get("id"): t for t in doc["tensors"] if isinstance(t, dict) and isinstance(t.get("id"), int)}
    role = rng.choice(sorted(node["inputs"]))
    bound = node["inputs"][role]
    current = bound[0] if isinstance(bound, list) and bound else bound
    dims = by_id.get(current, {}).get("dim") if isinstance(current, int) else None
    if not isinstance(dims, list):
        return "rewire: none"
    exact = rng.random() < 0.6
    same = [tid for tid, t in by_id.items() if tid != current and _fits(t.get("dim"), dims, exact)]
    if not same:
        return "rewire: none"
    choice = rng.choice(same)
    if isinstance(bound, list):
        bound[rng.randrange(len(bound))] = choice
    else:
        node["inputs"][role] = choice
    return f"rewire: {node.get('name')}.{role} = {by_id[choice].get('name')}"


def _fits(dims: Any, target: list[Any], exact: bool) -> bool:
    """``dims`` equal ``target`` (exact), or broadcast to it (same rank, each dim equal or 1)."""
    if not isinstance(dims, list) or len(dims) != len(target):
        return False
    return dims == target if exact else all(d in (e, 1) for d, e in zip(dims, target))


def _roles(kind: Any, side: str) -> list[str]:
    try:
        op = get_op(kind)
    except Exception:
        return []
    return [r.name for r in (op.inputs if side == "inputs" else op.outputs)]


def mutate_op(doc: dict[str, Any], rng: random.Random) -> str:
    node = _pick(rng, doc["nodes"])
    if node is None:
        return "op: none"
    node["op"] = rng.choice(op_kinds()) if rng.random() < 0.95 else rng.choice(["conv", "", 3, None])
    return f"op: {node.get('name')} = {node['op']!r}"


def mutate_attribute(doc: dict[str, Any], rng: random.Random) -> str:
    node = _pick(rng, doc["nodes"])
    if node is None or not isinstance(node.get("attributes"), dict):
        return "attribute: none"
    attributes = node["attributes"]
    try:
        known = [f.name for f in fields(get_op(node.get("op")).attributes)]
    except Exception:
        known = []
    name = rng.choice([*known, "bogus"]) if known and rng.random() < 0.5 else _pick(rng, sorted(attributes))
    if name is None:
        return "attribute: none"
    value = attributes.get(name)
    roll = rng.random()
    if roll < 0.1:
        attributes.pop(name, None)
        return f"attribute: {node.get('name')} drops {name}"
    if isinstance(value, list) and value and roll < 0.7:
        index = rng.randrange(len(value))
        value[index] = _integer(rng, value[index]) if isinstance(value[index], int) else rng.choice(ODD_VALUES)
        if rng.random() < 0.1:
            value.append(value[0])
    elif isinstance(value, float):
        attributes[name] = rng.choice([0.0, -1.0, 1e-30, 1e30, 2.5, 1e308, -0.0, 3, True])
    elif isinstance(value, str):
        attributes[name] = rng.choice(["", "training", "inference", "add", "max", "avg", "convolution", value + "x"])
    else:
        attributes[name] = _integer(rng, value) if rng.random() < 0.7 else rng.choice([[0], [1, 1], [2**40], [-1]])
    return f"attribute: {node.get('name')}.{name} = {attributes.get(name)!r}"


def mutate_structure(doc: dict[str, Any], rng: random.Random) -> str:
    """Delete, duplicate or reorder tensors and nodes."""
    key = rng.choice(["tensors", "nodes"])
    entries = doc[key]
    if not entries:
        return "structure: none"
    index = rng.randrange(len(entries))
    action = rng.choices(["delete", "duplicate", "swap"], [4, 3, 3])[0]
    if action == "delete":
        entries.pop(index)
        return f"structure: delete {key}[{index}]"
    if action == "duplicate":
        entries.insert(rng.randrange(len(entries) + 1), copy.deepcopy(entries[index]))
        return f"structure: duplicate {key}[{index}]"
    other = rng.randrange(len(entries))
    entries[index], entries[other] = entries[other], entries[index]
    return f"structure: swap {key}[{index}] and {key}[{other}]"


UNARY_KINDS = ["relu", "neg", "elu", "exp", "abs", "sigmoid", "tanh", "gelu", "identity", "sqrt", "log", "reciprocal"]
BINARY_KINDS = ["add", "sub", "mul", "div", "max", "min", "pow", "cmp_gt"]


def insert_pointwise(doc: dict[str, Any], rng: random.Random) -> str:
    """A new pointwise node reading existing tensors, writing a new output (chains grow)."""
    ids = [t for t in doc["tensors"] if isinstance(t.get("id"), int) and isinstance(t.get("dim"), list)]
    source = _pick(rng, ids)
    if source is None:
        return "insert: none"
    new_id = max(t["id"] for t in ids) + 1
    binary = rng.random() < 0.5
    kind = rng.choice(BINARY_KINDS if binary else UNARY_KINDS)
    inputs = {"a": source["id"], "b": _pick(rng, ids)["id"]} if binary else {"input": source["id"]}
    output = {
        "id": new_id,
        "name": f"fuzz{new_id}",
        "dim": list(source["dim"]),
        "data_type": rng.choice(["float", "half", "bfloat16", "float", source.get("data_type")]),
        "is_virtual": rng.random() < 0.3,
    }
    doc["tensors"].append(output)
    doc["nodes"].append({"name": f"fuzz_node{new_id}", "op": kind, "inputs": inputs, "outputs": {"y": new_id}})
    if output["is_virtual"]:  # a virtual result needs a reader: rebind one of an existing node
        readers = [n for n in doc["nodes"][:-1] if isinstance(n.get("inputs"), dict) and n["inputs"]]
        reader = _pick(rng, readers)
        if reader is not None:
            role = rng.choice(sorted(reader["inputs"]))
            if not isinstance(reader["inputs"][role], list):
                reader["inputs"][role] = new_id
    return f"insert: {kind} on {source.get('name')}"


def mutate_document(doc: dict[str, Any], rng: random.Random) -> str:
    """The top-level fields: format, version, unknown keys, wrong container types."""
    key = rng.choice(["format", "version", "name", "tensors", "nodes", "extra"])
    doc[key] = rng.choice([*ODD_VALUES, 2, "graphdnn.graph"])
    return f"document: {key} = {doc[key]!r}"


MUTATIONS: list[tuple[Mutation, int]] = [
    (mutate_dim, 12),
    (mutate_stride, 10),
    (mutate_data_type, 10),
    (mutate_tensor_flag, 6),
    (mutate_id, 4),
    (mutate_name, 4),
    (mutate_binding, 10),
    (rewire_compatible, 14),
    (mutate_op, 5),
    (mutate_attribute, 12),
    (mutate_structure, 5),
    (insert_pointwise, 12),
    (mutate_document, 1),
]


_DIMS_DIFFER = re.compile(
    r"output \w+ '(?P<name>[^']*)' has dims set to \[[\d, ]*\], but \w+ gives \[(?P<dim>[\d, ]*)\]"
)


def propagate(doc: dict[str, Any], rounds: int = 6) -> str:
    """Give outputs the dims their ops infer (repacked in their layout order), as a user
    would after changing an input's dims or an attribute: a mutation then reaches the
    kernels and the reference instead of stopping at the first output's declared dims."""
    fixed = []
    for _ in range(rounds):
        try:
            gd.OperationGraphSpec.from_json(json.dumps(doc))
            break
        except gd.ShapeError as error:
            found = _DIMS_DIFFER.search(error.reason)
            if found is None:
                break
            dim = [int(d) for d in found["dim"].split(", ")]
            for t in doc["tensors"]:
                if (
                    t.get("name") == found["name"]
                    and isinstance(t.get("stride"), list)
                    and len(t["stride"]) == len(dim)
                ):
                    t["stride"] = list(packed_strides(dim, stride_order(dim, t["stride"])))
                    t["dim"] = dim
                    fixed.append(found["name"])
                    break
            else:
                break
        except gd.GraphError:
            break
    return f"propagate dims to {', '.join(fixed)}" if fixed else "propagate: nothing"


def make_case(seed: int, case: int) -> tuple[str, str, list[str]]:
    """(seed graph name, mutated JSON text, mutations applied) of case ``case``."""
    rng = random.Random(f"graphdnn-fuzz:{seed}:{case}")
    name, text = rng.choice(corpus())
    doc = json.loads(text)
    functions, weights = zip(*MUTATIONS)
    applied = []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
        mutation = rng.choices(functions, weights)[0]
        try:
            applied.append(mutation(doc, rng))
        except (TypeError, AttributeError, KeyError, IndexError, ValueError):
            applied.append(f"{mutation.__name__}: not applicable")  # an earlier mutation broke the shape it needs
    if rng.random() < 0.4:
        applied.append(propagate(doc))
    return name, json.dumps(doc), applied


# -- checking a case ---------------------------------------------------------------------------
def check(text: str) -> Outcome:
    """Read, lower for sm_90 and run on the reference; anything but a GraphError is a finding."""
    try:
        ir = gd.OperationGraphSpec.from_json(text).validate()
    except gd.GraphError:
        return Outcome("rejected")
    except Exception:
        return Outcome("finding", "reading: " + _short_traceback())
    try:
        lowered = lower(fuse(ir, arch=90), 90, signature(ir), lambda content_hash: content_hash)
    except Exception:
        return Outcome("finding", "lowering for sm_90: " + _short_traceback())
    sources = {source.content_hash: source for source in lowered.sources.values()}
    if sum(numel(t.dim) for t in ir.tensors) > REFERENCE_BUDGET:
        return Outcome("accepted", "not run: large", sources)
    try:
        with np.errstate(all="ignore"):
            feeds = random_inputs(ir, 0)
            pack = {t.name: feeds[t.name] if t.is_pass_by_value else host_array(t, feeds[t.name]) for t in ir.inputs}
            ReferencePlan(ir).execute(pack)
    except gd.GraphError as error:
        return Outcome("accepted", f"reference refused: {error}", sources)
    except Exception:
        return Outcome("finding", "reference: " + _short_traceback(), sources)
    return Outcome("accepted", "", sources)


def compile_sources(sources: dict[str, KernelSource]) -> list[str]:
    """NVRTC-compile each kernel for sm_90 (its entry point checked); the failures, as findings."""
    from codegen.nvrtc import compile_cubin

    failed = []
    for content_hash, kernel in sources.items():
        try:
            compile_cubin(kernel.source, kernel.name, 90, kernel.arch_suffix)
        except Exception as error:
            failed.append(f"NVRTC, kernel {content_hash[:12]}: {type(error).__name__}: {str(error)[:2000]}")
    return failed


def _short_traceback() -> str:
    lines = traceback.format_exc().strip().splitlines()
    return "\n".join(lines[-12:])


# -- campaigns ---------------------------------------------------------------------------------
@dataclass
class Report:
    seed: int
    cases: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    findings: list[str] = field(default_factory=list)
    kernels: dict[str, KernelSource] = field(default_factory=dict)  # every distinct kernel emitted
    compiled: int = 0
    slowest: tuple[float, int] = (0.0, -1)  # seconds, case: unbounded work shows up here

    def summary(self) -> str:
        shown = ", ".join(f"{count} {status}" for status, count in sorted(self.counts.items()))
        return (
            f"seed {self.seed}: {self.cases} cases ({shown}); {len(self.kernels)} distinct kernels emitted, "
            f"{self.compiled} compiled; {len(self.findings)} findings; slowest case {self.slowest[1]} "
            f"({self.slowest[0]:.2f} s)"
        )


def run(seed: int, cases: Iterable[int], *, compile_sample: int | None = 0) -> Report:
    """Run the cases; then compile every distinct kernel (``compile_sample=None``) or a
    seeded sample of that many."""
    report = Report(seed)
    for case in cases:
        name, text, applied = make_case(seed, case)
        started = time.perf_counter()
        outcome = check(text)
        report.slowest = max(report.slowest, (time.perf_counter() - started, case))
        report.cases += 1
        report.counts[outcome.status] += 1
        if outcome.status == "accepted" and outcome.detail:
            report.counts[outcome.detail.split(":")[0]] += 1
        for content_hash, source in outcome.sources.items():
            report.kernels.setdefault(content_hash, source)
        if outcome.status == "finding":
            report.findings.append(f"{repro(seed, case)}  [{name}: {'; '.join(applied)}]\n{outcome.detail}")
    chosen = sorted(report.kernels)
    if compile_sample is not None:
        chosen = random.Random(seed).sample(chosen, min(compile_sample, len(chosen)))
    report.compiled = len(chosen)
    report.findings += [
        f"seed {seed}: {failure}" for failure in compile_sources({h: report.kernels[h] for h in chosen})
    ]
    return report


def repro(seed: int, case: int) -> str:
    return f"python -m tests.graph_fuzz --seed {seed} --case {case}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", type=int, help="run one case and show its mutated JSON")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument(
        "--compile", type=int, default=None, help="compile a sample of this many kernels (default: all)"
    )
    args = parser.parse_args(argv)
    if args.case is not None:
        name, text, applied = make_case(args.seed, args.case)
        print(f"seed graph {name}; mutations: {'; '.join(applied)}\n{text}")
        outcome = check(text)
        failures = compile_sources(outcome.sources)
        print(outcome.status, outcome.detail, *failures, sep="\n")
        return int(outcome.status == "finding" or bool(failures))
    started = time.monotonic()
    report = run(args.seed, range(args.start, args.start + args.cases), compile_sample=args.compile)
    for finding in report.findings:
        print(finding, end="\n\n")
    print(f"{report.summary()} in {time.monotonic() - started:.0f} s")
    return int(bool(report.findings))


if __name__ == "__main__":
    sys.exit(main())
