"""A Graphviz DOT picture of a partition: one cluster per fused node, coloured by kernel family.

Ops are boxes inside their fused node's cluster; graph inputs and outputs are ellipses.
An edge carries a tensor's name: solid where the tensor goes through memory, dashed
where it stays inside a fused node. Plain text, no graphviz package needed:
``dot -Tsvg out.dot -o out.svg`` renders it.
"""

from __future__ import annotations

from .partition import Family, FusedNode, Partition

FAMILY_COLOURS = {
    Family.GEMM: "#9ecae1",
    Family.ROW_NORM: "#a1d99b",
    Family.ROW_NORM_BACKWARD: "#74c476",
    Family.GROUP_NORM: "#c7e9c0",
    Family.BATCHNORM_TRAIN: "#fdae6b",
    Family.BATCHNORM_BACKWARD: "#fd8d3c",
    Family.REDUCTION: "#bcbddc",
    Family.ATTENTION: "#fcbba1",
    Family.ATTENTION_BACKWARD: "#fb6a4a",
    Family.ELEMENTWISE: "#fdd0a2",
    Family.DIRECT: "#d9d9d9",
}


def quote(text: str) -> str:
    """A DOT string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(partition: Partition) -> str:
    graph = partition.graph
    lines = [f"digraph {quote(graph.name)} {{", "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];']
    lines.append('  edge [fontname="Helvetica", fontsize=8];')
    for index, fused in enumerate(partition.nodes):
        lines.extend(_cluster(index, fused))
    for tensor in graph.inputs:
        lines.append(f"  {quote('tensor:' + tensor.name)} [label={quote(tensor.name)}, shape=ellipse];")
    for tensor in graph.outputs:
        lines.append(f"  {quote('tensor:' + tensor.name)} [label={quote(tensor.name)}, shape=ellipse, peripheries=2];")
    owner = {node.id: fused for fused in partition.nodes for node in fused.nodes}
    inputs = {t.id for t in graph.inputs}
    for node in graph.nodes:
        for tensor in dict.fromkeys(node.input_tensors()):
            producer = graph.producer(tensor)
            if producer is not None:
                inside = owner[producer.id] is owner[node.id]
                style = ", style=dashed, color=gray40" if inside else ""
                lines.append(
                    f"  {quote('node:' + producer.name)} -> {quote('node:' + node.name)} "
                    f"[label={quote(tensor.name)}{style}];"
                )
            elif tensor.id in inputs:
                lines.append(f"  {quote('tensor:' + tensor.name)} -> {quote('node:' + node.name)};")
        for tensor in node.output_tensors():
            if not tensor.is_virtual:
                lines.append(f"  {quote('node:' + node.name)} -> {quote('tensor:' + tensor.name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _cluster(index: int, fused: FusedNode) -> list[str]:
    colour = FAMILY_COLOURS[fused.family]
    label = f"{fused.name} [{fused.family.value}, rule {fused.rule}]"
    if fused.synthesized and fused.anchor is not None:
        label += f"\nas one {fused.anchor.op}"
    lines = [
        f"  subgraph cluster_{index} {{",
        f"    label={quote(label)}; style=filled; fillcolor={quote(colour)}; color=gray30;",
    ]
    for node in fused.nodes:
        role = "anchor" if node is fused.anchor else "prologue" if node is fused.prologue else ""
        text = f"{node.name}\n{node.op}" + (f" ({role})" if role else "")
        lines.append(
            f"    {quote('node:' + node.name)} [label={quote(text)}, shape=box, style=filled, fillcolor=white];"
        )
    lines.append("  }")
    return lines
