"""``lazy-mlir-opt``: run a pipeline of mlir_passes on torch-dialect .mlir text,
like mlir-opt (the driver of the tests/mlir lit suite).

    lazy-mlir-opt [FILE|-] -p PIPELINE [--split-input-file] [--mlir-print-debuginfo] [-o OUT]
    lazy-mlir-opt --list-passes
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys

from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d

import mlir_passes

SPLIT_MARKER = "// -----"


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.list_passes:
        for flag in mlir_passes.available_passes():
            print(f"{flag}\n    {' '.join(mlir_passes.get_pass(flag).description().split())}")
        return 0
    try:
        mlir_passes.parse_pipeline(args.pipeline)  # reject a bad pipeline before reading input
        text = sys.stdin.read() if args.input == "-" else pathlib.Path(args.input).read_text()
    except (mlir_passes.PipelineError, OSError) as exc:
        return _error(exc)
    chunks = _split(text) if args.split_input_file else [text]
    outputs, failed = [], False
    for chunk in chunks:
        try:
            outputs.append(_process(chunk, args.pipeline, args.mlir_print_debuginfo))
        except (ir.MLIRError, mlir_passes.PassError) as exc:
            failed = True
            _error(exc)
    result = f"\n{SPLIT_MARKER}\n".join(outputs)
    if args.output == "-":
        sys.stdout.write(result)
    else:
        pathlib.Path(args.output).write_text(result)
    return 1 if failed else 0


def _process(text: str, pipeline: str, debug_info: bool) -> str:
    context = ir.Context()
    torch_d.register_dialect(context)
    with context:
        module = ir.Module.parse(text)
        mlir_passes.run_pipeline(module, pipeline)
        return module.operation.get_asm(enable_debug_info=debug_info)


def _split(text: str) -> list[str]:
    """Chunks between ``// -----`` lines, each padded with blank lines so that
    locations in errors keep the line numbers of the whole file."""
    chunks, line = [], 0
    for chunk in re.split(rf"^{re.escape(SPLIT_MARKER)}[ \t]*$\n?", text, flags=re.M):
        chunks.append("\n" * line + chunk)
        line += chunk.count("\n") + 1
    return chunks


def _error(exc: Exception) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 1


def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="lazy-mlir-opt", description=__doc__.split("\n\n")[0])
    parser.add_argument("input", nargs="?", default="-", help="input .mlir file ('-' for stdin)")
    parser.add_argument("-p", "--pipeline", default="",
                        help=f"comma-separated pass flags, name{{opt=value}} for options "
                             f"(default: none; the compiler's is {mlir_passes.DEFAULT_PIPELINE!r})")
    parser.add_argument("--split-input-file", action="store_true",
                        help=f"process the chunks between '{SPLIT_MARKER}' lines separately")
    parser.add_argument("-o", "--output", default="-", help="output file ('-' for stdout)")
    parser.add_argument("--mlir-print-debuginfo", action="store_true", help="print op locations")
    parser.add_argument("--list-passes", action="store_true", help="list the passes and exit")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
