"""CTC loss: one block per sequence, the forward (alpha) and backward (beta) recursions in log
space over the sequence's 2L + 1 states, in shared memory, a step at a time.

Three phases in one kernel, all in fixed order (reproducible, no atomics):

1. softmax normalization only: the log-sum-exp over the alphabet of every step (block
   reductions), kept in a scratch row per sequence;
2. alpha, step by step (a __syncthreads between steps), each step's row also stored in
   scratch for phase 3; log p from the last row; the loss;
3. beta from the last step back; at each step the posterior of every state (alpha + beta -
   log p), then per alphabet entry the gradient softmax - (the posteriors of the states that
   emit it): the blank's are the even states, a label's the odd states holding it.
"""

from __future__ import annotations

from fusion_rules import FusedNode
from graphdnn.errors import UnsupportedError
from graphdnn.ops.ctc import CtcAttributes, CtcNormalization

from ..context import EmitContext, KernelParams
from ..cuda_types import store
from ..indexing import offset_at
from ..kernel import FusedProgram, Scratch
from ..pointwise import literal
from .direct_common import THREADS, anchor_of, compute_for, declare, make_kernel, read, written

ALPHA, NORMALIZER = "ctc_alpha", "ctc_normalizer"
SHARED_LIMIT = 48 * 1024  # static shared memory a kernel may declare


def emit_ctc_loss(fused: FusedNode, ctx: EmitContext) -> FusedProgram:
    node = anchor_of(fused)
    probs, labels = node.input("probs"), node.input("labels")
    label_lengths, input_lengths = node.input("label_lengths"), node.input("input_lengths")
    loss, grad = node.output("loss"), node.output("grad")
    a = node.attributes
    assert probs is not None and labels is not None and label_lengths is not None and input_lengths is not None
    assert loss is not None and grad is not None and isinstance(a, CtcAttributes)
    compute = compute_for(fused)
    size = 8 if compute == "double" else 4
    steps, batch, alphabet = probs.static_dim
    width = labels.static_dim[1]
    states = 2 * width + 1
    per_state, fixed = 3 * size + 4, (THREADS // 32) * size  # three rows and a label; the reduction scratch
    if states * per_state + fixed > SHARED_LIMIT:
        longest = ((SHARED_LIMIT - fixed) // per_state - 1) // 2
        raise UnsupportedError(
            f"ctc_loss keeps 2S + 1 = {states} states per sequence in shared memory ({states * per_state + fixed} "
            f"bytes, over {SHARED_LIMIT}): labels of at most {longest} entries run here",
            node=node.name,
            tensor=labels.name,
        )
    softmax = a.normalization is CtcNormalization.SOFTMAX
    params = KernelParams()
    names = declare(params, [probs, labels, label_lengths, input_lengths])  # the two lengths may be one tensor
    x, label = names[probs.id], names[labels.id]
    label_count, step_count = names[label_lengths.id], names[input_lengths.id]
    loss_out = params.tensor(loss, writable=True) if written(fused, loss) else None
    grad_out = params.tensor(grad, writable=True) if written(fused, grad) else None
    # the alpha rows are kept for the gradient only
    alpha_rows = params.scratch(ALPHA, compute) if grad_out is not None else None
    normalizer = params.scratch(NORMALIZER, compute) if softmax else None
    scratch = [Scratch(ALPHA, batch * steps * states * size)] if alpha_rows is not None else []
    if softmax:
        scratch.append(Scratch(NORMALIZER, batch * steps * size))

    minus_inf, zero = literal(float("-inf"), compute), literal(0, compute)

    def value(t: str, entry: str) -> str:
        return read(probs, x, offset_at(probs, [t, "n", entry]), compute)

    def log_p(t: str, entry: str) -> str:
        """log p of alphabet ``entry`` at step ``t``."""
        if softmax:
            return f"({value(t, entry)} - {normalizer}[(long long)n * {steps} + {t}])"
        return f"log({value(t, entry)})"

    def states_loop(body: list[str]) -> list[str]:
        return ["for (int s = threadIdx.x; s < count; s += blockDim.x) {", *("  " + line for line in body), "}"]

    def stored_alpha(t: str) -> str:
        return f"{alpha_rows}[((long long)n * {steps} + {t}) * {states} + s]"

    body = [
        "const int n = blockIdx.x;",
        f"__shared__ {compute} reduce_scratch[{THREADS // 32}];",
        f"__shared__ int extended[{states}];",
        f"__shared__ {compute} row_a[{states}], row_b[{states}], posterior[{states}];",
        f"const long long given_steps = (long long){step_count}[{offset_at(input_lengths, ['n'])}];",
        f"const long long given_labels = (long long){label_count}[{offset_at(label_lengths, ['n'])}];",
        "// lengths outside their range (the reference refuses them) are clamped, so memory stays in bounds",
        f"const int length = (int)(given_steps < 1 ? 1 : given_steps > {steps} ? {steps} : given_steps);",
        f"const int labels_n = (int)(given_labels < 0 ? 0 : given_labels > {width} ? {width} : given_labels);",
        "const int count = 2 * labels_n + 1;",
        f"auto add_log = [](const {compute} p, const {compute} q, const {compute} r) {{",
        f"  const {compute} top = max(p, max(q, r));",
        f"  return top == {minus_inf} ? top : top + log(exp(p - top) + exp(q - top) + exp(r - top));",
        "};",
        *states_loop(
            [
                "long long entry = 0;",
                f"if (s % 2 == 1) entry = (long long){label}[{offset_at(labels, ['n', 's / 2'])}];",
                f"extended[s] = (int)(entry < 0 ? 0 : entry > {alphabet - 1} ? {alphabet - 1} : entry);",
            ]
        ),
        "__syncthreads();",
    ]
    if softmax:
        body += [
            "// phase 1: each step's log-sum-exp over the alphabet",
            "for (int t = 0; t < length; ++t) {",
            f"  {compute} top = {minus_inf};",
            f"  for (int e = threadIdx.x; e < {alphabet}; e += blockDim.x) top = max(top, {value('t', 'e')});",
            f"  top = gd::group_max<{THREADS}>(top, reduce_scratch);",
            f"  {compute} total = {zero};",
            f"  for (int e = threadIdx.x; e < {alphabet}; e += blockDim.x) total += exp({value('t', 'e')} - top);",
            f"  total = gd::group_sum<{THREADS}>(total, reduce_scratch);",
            f"  if (threadIdx.x == 0) {normalizer}[(long long)n * {steps} + t] = top + log(total);",
            "}",
            "__syncthreads();",
        ]
    skip_back = "s >= 2 && extended[s] != 0 && extended[s] != extended[s - 2]"
    body += [
        "// phase 2: alpha, a step at a time",
        f"{compute}* previous = row_a;",
        f"{compute}* current = row_b;",
        "for (int t = 0; t < length; ++t) {",
        *(
            "  " + line
            for line in states_loop(
                [
                    f"{compute} v;",
                    "if (t == 0) {",
                    f"  v = s < 2 ? {zero} : {minus_inf};",
                    "} else {",
                    f"  v = add_log(previous[s], s >= 1 ? previous[s - 1] : {minus_inf}, "
                    f"{skip_back} ? previous[s - 2] : {minus_inf});",
                    "}",
                    f"v += {log_p('t', 'extended[s]')};",
                    "current[s] = v;",
                    *([f"{stored_alpha('t')} = v;"] if alpha_rows is not None else []),
                ]
            )
        ),
        "  __syncthreads();",
        f"  {compute}* swap = previous;",
        "  previous = current;",
        "  current = swap;",
        "}",
        f"const {compute} log_likelihood = add_log(previous[count - 1], "
        f"count >= 2 ? previous[count - 2] : {minus_inf}, {minus_inf});",
        f"const bool feasible = log_likelihood > {minus_inf};",
    ]
    if loss_out is not None:
        at = offset_at(loss, ["n"])
        body.append(f"if (threadIdx.x == 0) {loss_out}[{at}] = {store(loss.data_type, '-log_likelihood')};")
    if grad_out is not None:
        skip_ahead = "s + 2 < count && extended[s + 2] != 0 && extended[s + 2] != extended[s]"
        at = offset_at(grad, ["t", "n", "e"])
        gradient = f"feasible ? exp({log_p('t', 'e')}) - taken : {zero}"
        body += [
            "// phase 3: beta (without the emission at its step) from the last step back, and the gradient",
            "__syncthreads();  // every thread has read the last alpha row",
            f"{compute}* beta = previous;",
            f"{compute}* next = current;",
            *states_loop([f"beta[s] = s >= count - 2 ? {zero} : {minus_inf};"]),
            "__syncthreads();",
            "for (int t = length - 1; t >= 0; --t) {",
            *(
                "  " + line
                for line in states_loop([f"posterior[s] = exp({stored_alpha('t')} + beta[s] - log_likelihood);"])
            ),
            "  __syncthreads();",
            f"  for (int e = threadIdx.x; e < {alphabet}; e += blockDim.x) {{",
            f"    {compute} taken = {zero};",
            "    if (e == 0) {",
            "      for (int s = 0; s < count; s += 2) taken += posterior[s];",
            "    } else {",
            "      for (int s = 1; s < count; s += 2) if (extended[s] == e) taken += posterior[s];",
            "    }",
            f"    {grad_out}[{at}] = {store(grad.data_type, gradient)};",
            "  }",
            "  if (t > 0) {",
            *(
                "    " + line
                for line in states_loop(
                    [
                        f"next[s] = add_log(beta[s] + {log_p('t', 'extended[s]')}, "
                        f"s + 1 < count ? beta[s + 1] + {log_p('t', 'extended[s + 1]')} : {minus_inf}, "
                        f"{skip_ahead} ? beta[s + 2] + {log_p('t', 'extended[s + 2]')} : {minus_inf});",
                    ]
                )
            ),
            "  }",
            "  __syncthreads();",
            f"  {compute}* swap = beta;",
            "  beta = next;",
            "  next = swap;",
            "}",
            "// steps past the sequence's length",
            f"for (int t = length; t < {steps}; ++t)",
            f"  for (int e = threadIdx.x; e < {alphabet}; e += blockDim.x) {grad_out}[{at}] = {store(grad.data_type, zero)};",
        ]
    kernel = make_kernel(ctx, fused, "ctc_loss", params, body, (batch, 1, 1))
    return FusedProgram(fused.name, (kernel,), tuple(scratch))
