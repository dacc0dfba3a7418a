"""A graph's torch op differentiated by a backward graph: the names that tie the two
graphs together, their checks, and the autograd formula torch calls.

The backward graph says what it needs by the names of its inputs:

- a forward input's name: that input (a tensor is saved when the forward op runs);
- a forward output's name: that output, saved likewise (e.g. layer norm's ``mean``);
- ``grad_<output>``: the gradient reaching forward output ``<output>``.

Its outputs are ``grad_<input>``: the gradient of forward tensor input ``<input>``, with
that input's dims and data type. Every input named after a forward tensor has that
tensor's dims, data type and kind (tensor or pass-by-value scalar). Forward outputs with
no ``grad_<output>`` input (saved statistics such as layer norm's ``mean`` or attention's
``stats``) are marked non-differentiable; a forward input with no ``grad_<input>`` output
gets no gradient, and backward through the op while it requires grad raises. Nothing
here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..errors import GraphError, UnsupportedError
from ..ir import Tensor
from ..symbolic import show
from .op_schema import OpSchema, op_schema

GRAD_PREFIX = "grad_"


class Source(Enum):
    """Where the backward op takes one of its arguments from."""

    INPUT = "forward input"  # a forward tensor argument, saved with save_for_backward
    SCALAR = "forward scalar"  # a forward pass-by-value argument, kept on ctx
    OUTPUT = "forward output"  # a forward result, saved with save_for_backward
    GRAD = "gradient of forward output"  # a result's gradient, as torch hands it to backward


@dataclass(frozen=True)
class BackwardArgument:
    source: Source
    index: int  # position among the forward op's arguments (INPUT, SCALAR) or results (OUTPUT, GRAD)


@dataclass(frozen=True)
class BackwardWiring:
    """How the backward op's arguments and results map onto the forward op's."""

    forward: OpSchema
    backward: OpSchema
    arguments: tuple[BackwardArgument, ...]  # one per backward argument, in its order
    gradients: tuple[int | None, ...]  # per forward argument: the position of its gradient among backward's results
    differentiable: tuple[bool, ...]  # per forward result: whether backward takes its gradient

    def setup_context(self, ctx: Any, inputs: Sequence[Any], output: Any) -> None:
        """Keep what the backward op reads: tensors with ``save_for_backward``, scalars on ``ctx``."""
        results = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(
            *(
                results[a.index] if a.source is Source.OUTPUT else inputs[a.index]
                for a in self.arguments
                if a.source in (Source.INPUT, Source.OUTPUT)
            )
        )
        ctx.graphdnn_scalars = [inputs[a.index] for a in self.arguments if a.source is Source.SCALAR]
        ctx.mark_non_differentiable(*(r for r, d in zip(results, self.differentiable) if not d))

    def formula(self, backward_op: Any, name: str) -> Callable[..., tuple[Any, ...]]:
        """The autograd formula of op ``name``: ``backward_op`` on the kept values and the results' gradients."""

        def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
            for i, needed in enumerate(ctx.needs_input_grad):
                if needed and self.gradients[i] is None:
                    raise UnsupportedError(
                        f"torch op {name}: argument '{self.forward.arguments[i]}' requires grad, but backward graph "
                        f"'{self.backward.graph.name}' has no output '{GRAD_PREFIX}{self.forward.inputs[i].name}'",
                        tensor=self.forward.inputs[i].name,
                    )
            saved, scalars = iter(ctx.saved_tensors), iter(ctx.graphdnn_scalars)
            kept = {Source.INPUT: saved, Source.OUTPUT: saved, Source.SCALAR: scalars}
            args = [grads[a.index] if a.source is Source.GRAD else next(kept[a.source]) for a in self.arguments]
            results = backward_op(*args)
            results = results if isinstance(results, tuple) else (results,)
            return tuple(None if g is None else results[g] for g in self.gradients)

        return backward


def wire_backward(forward: OpSchema, backward_graph: Any) -> BackwardWiring:
    """Check ``backward_graph`` (a plan, an OperationGraphSpec or a Graph) against the
    naming convention and the forward op; a GraphError naming the backward tensor otherwise."""
    backward = op_schema(backward_graph)
    where = f"backward graph '{backward.graph.name}'"
    arguments = tuple(_argument(forward, t, where) for t in backward.inputs)
    if not any(a.source is Source.GRAD for a in arguments):
        raise GraphError(
            f"{where} takes no gradient: name an input {GRAD_PREFIX}<output> after a forward output "
            f"({_names(forward.outputs)})"
        )
    by_input = {t.name: i for i, t in enumerate(forward.inputs)}
    gradients: list[int | None] = [None] * len(forward.inputs)
    for position, t in enumerate(backward.outputs):
        i = by_input.get(t.name.removeprefix(GRAD_PREFIX)) if t.name.startswith(GRAD_PREFIX) else None
        if i is None or forward.inputs[i].is_pass_by_value:
            raise GraphError(
                f"{where}: output '{t.name}' names no forward tensor input; its outputs are "
                f"{GRAD_PREFIX}<input> for inputs of ({_names(forward.inputs[j] for j in forward.tensor_inputs)})",
                tensor=t.name,
            )
        _check_like(t, forward.inputs[i], where, f"forward input '{forward.inputs[i].name}'")
        gradients[i] = position
    graded = {a.index for a in arguments if a.source is Source.GRAD}
    differentiable = tuple(j in graded for j in range(len(forward.outputs)))
    return BackwardWiring(forward, backward, arguments, tuple(gradients), differentiable)


def _argument(forward: OpSchema, t: Tensor, where: str) -> BackwardArgument:
    """What backward input ``t`` names, checked to have the dims, type and kind of the tensor it names."""
    meanings = [
        (Source.SCALAR if f.is_pass_by_value else Source.INPUT, i, f, f"forward input '{f.name}'")
        for i, f in enumerate(forward.inputs)
        if f.name == t.name
    ]
    meanings += [
        (Source.OUTPUT, j, f, f"forward output '{f.name}'") for j, f in enumerate(forward.outputs) if f.name == t.name
    ]
    meanings += [
        (Source.GRAD, j, f, f"the gradient of forward output '{f.name}'")
        for j, f in enumerate(forward.outputs)
        if GRAD_PREFIX + f.name == t.name
    ]
    if not meanings:
        raise GraphError(
            f"{where}: input '{t.name}' names no forward input, output or output gradient; its inputs are named "
            f"after forward inputs ({_names(forward.inputs)}), forward outputs ({_names(forward.outputs)}) "
            f"and {GRAD_PREFIX}<output>",
            tensor=t.name,
        )
    if len(meanings) > 1:
        raise GraphError(
            f"{where}: input '{t.name}' could be {' or '.join(m[3] for m in meanings)}; rename one of them",
            tensor=t.name,
        )
    ((source, index, named, what),) = meanings
    _check_like(t, named, where, what)
    return BackwardArgument(source, index)


def _check_like(t: Tensor, named: Tensor, where: str, what: str) -> None:
    if t.is_pass_by_value != named.is_pass_by_value:
        kinds = ("a tensor", "a pass-by-value scalar")
        raise GraphError(
            f"{where}: '{t.name}' is {kinds[t.is_pass_by_value]}, {what} is {kinds[named.is_pass_by_value]}",
            tensor=t.name,
        )
    if t.dim != named.dim or t.data_type != named.data_type:
        raise GraphError(
            f"{where}: '{t.name}' has dims {show(t.dim)} {t.data_type.value}, "
            f"{what} has {show(named.dim)} {named.data_type.value}",
            tensor=t.name,
        )


def _names(tensors: Any) -> str:
    return ", ".join(repr(t.name) for t in tensors)
