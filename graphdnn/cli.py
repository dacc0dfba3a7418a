"""The ``graphdnn`` command: validate, inspect, run and warm up graph files; manage the plan cache.

``-v`` shows graphdnn's log at info level (fusion outcomes, cache hits and misses, compile
times), ``-vv`` at debug level (every fusion decision); without it GRAPHDNN_LOG decides.

Every failure prints one line, ``graphdnn: error: <file>: <where>: <what>``, and exits
non-zero; no traceback reaches the user for a bad file or a missing GPU.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .arch import parse_arch, parse_target
from .commands import cache, env, run, warmup
from .errors import GraphError
from .files import load_graph
from .fusion import fuse
from .ir import Graph, Tensor
from .logs import verbose
from .names import printable
from .runtime.driver import CudaError
from .signature import signature
from .version import __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.run
    try:
        if not args.verbose:
            return command(args)
        with verbose(logging.INFO if args.verbose == 1 else logging.DEBUG):
            return command(args)
    except (GraphError, CudaError) as error:
        print(f"graphdnn: error: {printable(str(error), lines=True)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graphdnn", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"graphdnn {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log to stderr: -v info (cache hits and misses, compile times), -vv debug (every fusion decision)",
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    validate = commands.add_parser("validate", help="check graph files; exit 1 at the first bad one")
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.set_defaults(run=_validate)

    inspect = commands.add_parser("inspect", help="print a graph's nodes, tensor shapes and signature")
    inspect.add_argument("file", metavar="FILE")
    inspect.add_argument("--fused", action="store_true", help="also print the fusion partition and its reasons")
    inspect.add_argument(
        "--dot", metavar="OUT.dot", help="write a Graphviz DOT file of the graph, clustered by fused node"
    )
    inspect.add_argument(
        "--svg",
        metavar="OUT.svg",
        help="write that picture as SVG, rendered by Graphviz's dot program (which must be on PATH)",
    )
    inspect.add_argument(
        "--disable", action="append", default=[], metavar="RULE", help="fuse without this rule (repeatable)"
    )
    inspect.add_argument(
        "--cuda",
        action="store_true",
        help="print the CUDA source of every kernel the graph compiles to (no GPU needed)",
    )
    inspect.add_argument("--out", metavar="DIR", help="with --cuda: write each kernel to DIR/<name>.<arch>.cu instead")
    inspect.add_argument("--arch", default=None, help="target architecture for fusion, e.g. sm_80 (default sm_90)")
    inspect.set_defaults(run=_inspect)

    for command in (run, warmup, cache, env):
        command.add(commands)
    return parser


def _validate(args: argparse.Namespace) -> int:
    for path in args.files:
        ir = load_graph(path)
        print(
            f"{printable(path)}: ok ({len(ir.nodes)} nodes, {len(ir.tensors)} tensors, signature {signature(ir)[:16]})"
        )
    return 0


def _inspect(args: argparse.Namespace) -> int:
    if args.arch is not None:  # checked here, not by argparse: a bad target is a one-line error, exit 1
        parse_target(args.arch)
    if args.out and not args.cuda:
        raise GraphError("--out names where --cuda writes kernel sources: add --cuda")
    ir = load_graph(args.file)
    if args.cuda:
        return _inspect_cuda(ir, args)
    print(printable(describe(ir), lines=True))
    if args.fused or args.dot or args.svg:
        partition = fuse(ir, arch=args.arch, disable=args.disable)
        if args.fused:
            print()
            print(printable(partition.describe(), lines=True))
        if args.dot or args.svg:
            from fusion_rules.dot import to_dot

            dot = to_dot(partition)
        if args.dot:
            try:
                with open(args.dot, "w", encoding="utf-8") as out:
                    out.write(dot)
            except OSError as error:
                raise GraphError(f"cannot write {args.dot}: {error.strerror}") from None
            print(f"wrote {args.dot}")
        if args.svg:
            from .svg import render_svg

            render_svg(dot, args.svg)
            print(f"wrote {args.svg}")
    return 0


def _inspect_cuda(ir: Graph, args: argparse.Namespace) -> int:
    """Lower the graph as a compile would (fuse, emit; pure Python) and show each distinct kernel."""
    from .compilation import Compilation
    from .dump import write_sources
    from .lower import lower

    job = Compilation.of(ir, parse_arch(args.arch), args.disable)
    sources = lower(job.partition, job.target, job.signature, job.fields.kernel_key).sources.values()
    if args.out:
        for path in write_sources(Path(args.out), sources, job.target, why="--out"):
            print(f"wrote {path}")
        return 0
    for source in sources:
        print(f"// ===== {source.name} ({source.target(job.target)}) =====")
        print(source.source)
    return 0


def describe(ir: Graph) -> str:
    """A human-readable listing of a graph: symbols, inputs, nodes with shapes, outputs, signature."""
    lines = [f"graph '{ir.name}'  signature {signature(ir)}"]
    if ir.symbols:
        lines.append(f"  symbols ({len(ir.symbols)}):")
        lines.extend(f"    {s.name}: {s.min}..{s.max}" for s in ir.symbols)
    lines.append(f"  inputs ({len(ir.inputs)}):")
    lines.extend(f"    {_tensor_line(t)}" for t in ir.inputs)
    lines.append(f"  nodes ({len(ir.nodes)}):")
    for node in ir.nodes:
        ins = ", ".join(
            f"{role}={'[' + ', '.join(t.name for t in bound) + ']' if isinstance(bound, tuple) else bound.name}"
            for role, bound in node.inputs
        )
        lines.append(f"    {node.name}: {node.op}({ins})  compute {node.compute_data_type.value}")
        attrs = node.attributes.to_json()
        if attrs:
            lines.append("      " + " ".join(f"{k}={v}" for k, v in attrs.items()))
        for role, t in node.outputs:
            lines.append(f"      -> {role}: {_tensor_line(t)}")
    lines.append(f"  outputs ({len(ir.outputs)}):")
    lines.extend(f"    {_tensor_line(t)}" for t in ir.outputs)
    return "\n".join(lines)


def _tensor_line(t: Tensor) -> str:
    kind = "virtual" if t.is_virtual else ("constant" if t.is_constant else "")
    shape = "x".join(map(str, t.dim)) if not t.symbols else f"[{', '.join(map(str, t.dim))}]"
    extra = f" = {t.value}" if t.is_constant else ""
    return f"{t.name}: {shape} {t.data_type.value} stride {list(t.stride)} {kind}{extra}".rstrip()


if __name__ == "__main__":
    sys.exit(main())
