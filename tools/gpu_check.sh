#!/bin/bash
# Issue 11's GPU checks, in one run on a machine with an NVIDIA GPU whose
# python3 already holds a CUDA build of torch and Triton, and which cannot
# fetch packages (the lent device machines: torch 2.11, not our 2.13 pin).
# torch-mlir comes packed as a site folder: .gpu/torch_mlir_site.tar.xz, made
# by `tools/gpu_check.sh --pack` on a machine with pip (cp312 wheel, its
# torch-mlir-opt binary left out: we use our own lazy-mlir-opt; ~45 MB).
# .gpu/ is ignored (.gitignore): a device tool carries it to the machine by name.
#
# Builds the extension against that torch with cmake (not pip: no index),
# trying the machine's compilers until tests/test_extension_build.py passes,
# then runs, each with its own time limit, logging under $OUT (default
# /tmp/gpu_check):
#   tests    tests/test_cuda.py (MLP, GPT-mini, HF GPT-2 at O1 and O2, fp64 vs
#            eager on the GPU) and ZeRO stages 1-3 on NCCL (one rank);
#            TESTS_S seconds at most
#   nccl2    with NCCL2=1, whether NCCL takes two ranks on the one GPU (it did
#            not on 2026-11-26: "Duplicate GPU detected")
#   bench    benchmarks/gpt_step.py --paired on the GPU, once per lazy_mlir
#            row (the model captured; then, after zero, BENCH_ROWS: captured
#            without CUDA graphs, O1), each beside eager and
#            torch.compile(model + optimizer) in its default, reduce-overhead
#            and max-autotune-no-cudagraphs modes (the table names the
#            fastest); BENCH_S seconds at most each
#   zero     benchmarks/zero_step.py --device cuda on one NCCL rank: our
#            ZeRO-3 (per-op trace, and the model captured) against DeepSpeed
#            ZeRO-3 with DeepCompile and without (ZERO_ROWS, ZERO_S seconds at
#            most; DeepSpeed from .whl/); each round's figures are logged as
#            they come, so a run cut short keeps them
#   zoo      benchmarks/models.py --paired on the GPU, one process per model
#            (ZOO_MODELS, default gpt2,resnet,bert): eager,
#            torch.compile(loss + opt) in its three modes, the captured loss;
#            ZOO_S seconds at most each
# Most important first: a run cut short still says what matters. PHASES
# picks some of "tests bench zero more zoo" (default: all).
# `--build-only` stops after the build; REUSE_BUILD=1 keeps the extension
# a warm machine's previous call built, if it still passes its check;
# `--pack` and `--pack-deepspeed` make
# what the machine cannot fetch (.gpu/, .whl/: carry both).
set -u
cd "$(dirname "$0")/.."
PACK=.gpu/torch_mlir_site.tar.xz
if [ "${1:-}" = "--pack" ]; then
  set -e
  version=$(sed -n 's/^torch-mlir==//p' requirements.txt)
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$tmp/wheel" "torch-mlir==$version"
  python3 -m pip install -q --no-deps --target "$tmp/site" --python-version 3.12 --only-binary=:all: "$tmp"/wheel/*.whl
  rm -f "$tmp/site/torch_mlir/_mlir_libs/torch-mlir-opt"
  mkdir -p .gpu && tar -C "$tmp/site" -cJf "$PACK" . && rm -rf "$tmp"
  ls -la "$PACK"
  exit 0
fi
# DeepSpeed's wheels for .whl/, made here with the venv's torch (its setup
# imports torch): a wheel without prebuilt ops, and what it needs that the
# lent machines lack (cp312 wheels); and our transformers pin.
if [ "${1:-}" = "--pack-deepspeed" ]; then
  set -e
  mkdir -p .whl
  DS_BUILD_OPS=0 .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl pydantic==2.14.4 \
    pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 hjson==3.1.0
  # our transformers pin (the machines' own is older), for the zoo's HF models
  python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "$(grep '^transformers==' requirements.txt)"
  ls -la .whl
  exit 0
fi

OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
step() { echo "== $(date +%T) $*"; }

step environment
{ nvidia-smi -L
  python3 -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'CUDA',
              torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  g++ --version | head -1; cmake --version | head -1; nproc; } 2>&1 | tee "$OUT/environment.txt"

step "torch-mlir from $PACK"
site=/tmp/gpu_check_site
mkdir -p $site && tar -C $site -xJf "$PACK" || { echo "no $PACK: run tools/gpu_check.sh --pack first"; exit 1; }
export PYTHONPATH="$PWD/python:$PWD:$site"

build_with() {  # $1: the compiler (cmake's Torch package also wants the CUDA toolkit, nvcc, for a CUDA torch)
  rm -rf build/gpu python/lazy_mlir/_C*.so
  cmake -S . -B build/gpu -G Ninja -DPython_EXECUTABLE="$(command -v python3)" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CXX_COMPILER="$1" >> "$OUT/build.log" 2>&1 \
    && cmake --build build/gpu -j"$(nproc)" >> "$OUT/build.log" 2>&1 && cp build/gpu/_C*.so python/lazy_mlir/
}
# DeepSpeed (for DeepCompile) travels as wheels in .whl/ (ignored), made where
# pip works (a DS_BUILD_OPS=0 wheel of deepspeed, pydantic and the rest its
# requirements lack there). Its DeepCompile op is JIT-built by nvcc: started
# now, beside our build, so that zero_step finds it built. DeepSpeed's builder
# cannot parse an arch like "9.0a" (seen in the machine's TORCH_CUDA_ARCH_LIST):
# the GPU's own capability instead.
if ls .whl/*.whl > /dev/null 2>&1; then
  step "deepspeed and transformers from .whl"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ds_site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/ds_site" DS_SKIP_CUDA_CHECK=1 \
    && export TORCH_CUDA_ARCH_LIST="$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')" \
    && (timeout 400 python3 -c "from deepspeed.ops.op_builder import DeepCompileBuilder; DeepCompileBuilder().load()" \
        > "$OUT/dc_build.log" 2>&1 &)
fi

# The extension must use the process's one libstdc++: a compiler that links
# it statically (seen: the lent machines' /opt/gcc/bin/g++) makes one that
# segfaults in torch's iostreams. Each compiler on the machine is tried until
# tests/test_extension_build.py passes.
step "build the extension against $(python3 -c 'import torch; print(torch.__version__)')"
built=
# REUSE_BUILD=1: a warm machine's extension from the call before, if it still passes
if [ "${REUSE_BUILD:-0}" = 1 ] && ls python/lazy_mlir/_C*.so > /dev/null 2>&1 \
   && python3 -m pytest -q -p no:cacheprovider tests/test_extension_build.py; then built=reused; fi
[ -n "$built" ] || for cxx in $(for c in /usr/bin/g++ "$(command -v g++)" /opt/gcc/bin/g++; do [ -x "$c" ] && echo "$c"; done \
             | awk '!seen[$0]++'); do
  echo "-- $cxx: $("$cxx" --version | head -1)"
  build_with "$cxx" || { tail -30 "$OUT/build.log"; continue; }
  if python3 -m pytest -q -p no:cacheprovider tests/test_extension_build.py; then built=$cxx; break; fi
done
[ -n "$built" ] || { echo "no compiler made a working extension"; exit 1; }
[ "${1:-}" = "--build-only" ] && exit 0

phase() { [[ " ${PHASES:-tests bench zero more zoo} " == *" $1 "* ]]; }

phase tests && { step tests
timeout "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider -n 8 -rs tests/test_cuda.py \
  tests/zero/test_zero.py::test_zero_on_nccl_matches_single_process 2>&1 | tee "$OUT/tests.txt" | tail -40; }

step "nccl with two ranks on one GPU"
[ "${NCCL2:-0}" = 1 ] && {
cat > /tmp/nccl2.py <<'EOF'
import torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl")
t = torch.ones(4, device="cuda")
dist.all_reduce(t)
print("rank", dist.get_rank(), "all_reduce ->", t.tolist())
EOF
timeout 60 python3 -m torch.distributed.run --nproc_per_node=2 /tmp/nccl2.py > "$OUT/nccl2.txt" 2>&1
echo "exit $?" >> "$OUT/nccl2.txt"
grep -m3 -i "all_reduce ->\|duplicate\|error" "$OUT/nccl2.txt"; tail -1 "$OUT/nccl2.txt"; }

# --paired takes one lazy_mlir row: one run per row, each beside eager and
# torch.compile(model + opt)'s modes in its process
bench() {
  step "bench $1"
  (cd benchmarks && timeout "${BENCH_S:-240}" python3 gpt_step.py --paired --steps 20 --warmup 5 \
    --only "eager,compile_model_opt,compile_model_opt_reduce_overhead,compile_model_opt_max_autotune,$1" --json "$OUT/gpt_step.$1.json") 2>&1 \
    | tee -a "$OUT/bench.txt" | grep -A12 "^GPT-mini step"
}
phase bench && bench lazy_mlir_O1_capture

# ZeRO-3 against DeepSpeed's ZeRO-3, eager and DeepCompile, one NCCL rank
phase zero && { step zero
(cd benchmarks && timeout "${ZERO_S:-300}" python3 zero_step.py --device cuda --nproc 1 \
   --only "${ZERO_ROWS:-zero3,zero3_capture,deepcompile,deepspeed}" --steps 10 --warmup 8 --rounds 2 --json "$OUT/zero_step.json") \
  > "$OUT/zero.txt" 2>&1
grep -B2 -A8 "^GPT-mini" "$OUT/zero.txt" || { grep "ms/step, loss" "$OUT/zero.txt"; tail -30 "$OUT/zero.txt"; }; }

phase more && for row in ${BENCH_ROWS:-lazy_mlir_O1_capture_no_cuda_graphs lazy_mlir_O1}; do bench "$row"; done

# The zoo's small models on the GPU: the captured loss against torch.compile(loss + opt),
# one process per model, so that a run cut short keeps the models done before
phase zoo && for model in $(echo "${ZOO_MODELS:-gpt2,resnet,bert}" | tr , ' '); do step "zoo $model"
(cd benchmarks && timeout "${ZOO_S:-240}" python3 models.py --paired --block 5 --steps 20 --warmup 5 \
   --models "$model" --only eager,compile_loss_opt,compile_loss_opt_reduce_overhead,compile_loss_opt_max_autotune,lazy_mlir_O1_capture_loss \
   --json "$OUT/models.$model.json") > "$OUT/zoo.$model.txt" 2>&1
grep -A6 "^Zoo training steps" "$OUT/zoo.$model.txt" || tail -20 "$OUT/zoo.$model.txt"; done
step done
