"""Calling a group's C++-wrapped code from C++, without Python per call.

With Inductor's C++ wrapper (``Config.cpp_wrapper``) a group's code is a
shared library whose ``inductor_entry_impl`` takes and returns tensor
handles. The way to it from CompiledGroup::run went through Python:
AOTAutograd's runtime wrapper, Inductor's CompiledFxGraph and the generated
``call``, which wrap every input and output in a Python tensor. An output's
Python object then lives while LTC holds the tensor and is freed in the
next step's trace (~1 us a tensor). So once, at the first run of a group's
code, ``probe`` runs it through Python watching the one call into the
generated module, and works out by identity which group input each entry
argument is and which entry result, or group input, each group output is.
It gives that plan only when the wrapper around the entry did nothing else
that C++ does not do too: every argument is a group input as it was given;
every output an entry result, an input, or a view the wrapper rebuilt of an
input whose elements and layout a result holds (C++ returns a new alias of
that result); every entry result such an output or the memory of an input
(written in place). A result the wrapper copied into an input, or a view
laid out like no result, makes the plan None. The C++
side (runtime/native_entry.h) then calls the entry while the inputs keep the
layouts of that run; any other input falls back to the Python path.

What the Python path did that the native call skips: AOTAutograd bumps the
version counter of an input the graph wrote (a donated buffer: dead once
the group ran; never 0-d, so never a scalar whose version ScalarGuards
reads) and sets the grad mode (the kernels record no autograd).
"""
from __future__ import annotations

import dataclasses
import threading

import torch


@dataclasses.dataclass(frozen=True)
class Plan:
    library: str          # the loaded shared library holding inductor_entry_impl
    arguments: list[int]  # the group input passed as each entry argument
    num_results: int
    outputs: list[int]    # per group output: an entry result (>= 0) or group input -1 - k
    aliases: list[int] = dataclasses.field(default_factory=list)  # outputs returned as a new alias of their result


_watching = threading.local()  # .calls: the CompiledFxGraph calls seen on this thread during a probe
_probing = threading.Lock()  # one probe at a time: each puts back the __call__ it found


def probe(run, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], Plan | None]:
    """Runs ``run(inputs)`` (the group's code through Python) and returns its
    outputs and the plan to call it from C++, or None."""
    from torch._inductor.output_code import CompiledFxGraph

    given = list(inputs)

    def watched(graph, args):
        calls = getattr(_watching, "calls", None)
        if calls is None:  # another thread's call
            return original(graph, args)
        seen = list(args)  # the generated call empties the list
        results = original(graph, args)
        calls.append((graph, seen, results))
        return results

    with _probing:
        original = CompiledFxGraph.__call__
        _watching.calls = []
        CompiledFxGraph.__call__ = watched
        try:
            outputs = run(inputs)
        finally:
            CompiledFxGraph.__call__ = original
            calls, _watching.calls = _watching.calls, None
    return outputs, _plan(given, outputs, calls)


def _plan(given, outputs, calls) -> Plan | None:
    if len(calls) != 1:
        return None
    graph, args, results = calls[0]
    generated = getattr(graph.current_callable, "__globals__", {})
    entry = generated.get("inductor_entry")
    library = getattr(getattr(entry, "__self__", None), "__file__", None)
    if generated.get("call") is not graph.current_callable or not isinstance(library, str):
        return None  # not the C++ wrapper's generated module
    if not isinstance(results, (list, tuple)) or not all(isinstance(r, torch.Tensor) for r in results):
        return None
    by_id = {}
    for k, t in enumerate(given):
        by_id.setdefault(id(t), k)
    arguments = [by_id.get(id(a)) for a in args]
    if any(k is None for k in arguments):
        return None  # an argument the wrapper made (a size, a view): not ours to give
    result_of = {id(r): k for k, r in enumerate(results)}
    plan_outputs, aliases = [], []
    for j, out in enumerate(outputs):
        if id(out) in result_of:
            plan_outputs.append(result_of[id(out)])
        elif id(out) in by_id:
            plan_outputs.append(-1 - by_id[id(out)])
        else:  # made by the wrapper: an alias it rebuilt of the result it equals
            twin = next((k for k, r in enumerate(results) if _same_memory(out, r)), None)
            if twin is None:
                return None
            plan_outputs.append(twin)
            aliases.append(j)
    for k, r in enumerate(results):
        if k not in plan_outputs and not any(_same_memory(r, t) for t in list(outputs) + given):
            return None  # a result the wrapper used otherwise (copied into an input)
    return Plan(library, arguments, len(results), plan_outputs, aliases)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same elements of the same memory.
    AOTAutograd rebuilds an output that aliases an input as a new view of
    that input (an updated weight written into its donated buffer, and its
    transpose), though the code returned the same elements as a result (or
    the input itself): C++ returns a new alias of that result, so that the
    output is neither the input's tensor nor another output's (the next
    step's groups were compiled for such distinct tensors)."""
    return (a.dtype == b.dtype and a.device == b.device and a.shape == b.shape and a.stride() == b.stride()
            and a.storage_offset() == b.storage_offset()
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())
