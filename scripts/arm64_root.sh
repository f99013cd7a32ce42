#!/usr/bin/env bash
# An arm64 Python 3.11 with torch, run under qemu-aarch64 user mode on an x86-64 machine, for
# tests/emulated/test_cross_arch.py. Prepared once into a cache folder (about 1 GB, a few minutes) and reused:
#
#   ROOT/       Debian bookworm's arm64 Python 3.11 and the C libraries it and torch need, unpacked
#               with `dpkg -x` (no maintainer scripts run, nothing is installed on this machine)
#   SITE/       arm64 wheels: torch 2.9.1 (its arm64 wheel on PyPI is a CPU build; 2.13.0's is a
#               CUDA one), transformers, pytest and the plugin's other dependencies, and gguf and
#               accelerate (SmolLM2's .gguf file). The plugin itself is not installed: the test puts
#               the source tree on PYTHONPATH.
#   READY       written last: its presence means the rest is complete
#
# Run:  qemu-aarch64 -L ROOT ROOT/usr/bin/python3.11   with PYTHONPATH=SITE
# Usage: scripts/arm64_root.sh [CACHE]   (default ~/.cache/pytest-llmdeterminism/arm64)
# Needs apt-get, dpkg and pip on the host; apt's state lives in CACHE, so this machine's package
# lists and architectures are left as they are.
set -euo pipefail

CACHE="${1:-${LLMDET_ARM64_CACHE:-$HOME/.cache/pytest-llmdeterminism/arm64}}"
TORCH_VERSION="2.9.1"
# Python's own packages and the libraries its extension modules and torch's wheel link against.
DEBS=(libc6 libgcc-s1 libstdc++6 gcc-12-base python3.11-minimal libpython3.11-minimal libpython3.11-stdlib
      libexpat1 zlib1g libssl3 libffi8 libbz2-1.0 liblzma5 libsqlite3-0 libuuid1 libcrypt1 libncursesw6
      libtinfo6 libreadline8 libgomp1 media-types)
# torch's own dependencies are named here and torch goes in with --no-deps: pip evaluates environment
# markers for the host, so torch's `platform_machine == "x86_64"` CUDA wheels (4 GB) would come along.
WHEELS=(filelock typing-extensions sympy networkx jinja2 fsspec "transformers>=4.56" "pytest>=8.0"
        "hypothesis>=6.100" "xxhash>=3.0" "msgspec>=0.18" numpy safetensors)
# What transformers needs to load a .gguf file (the [gguf] extra); accelerate, like torch, goes in
# with --no-deps, its dependencies named here.
GGUF_WHEELS=("gguf>=0.10" psutil pyyaml packaging huggingface_hub)
GGUF_NO_DEPS=("accelerate>=1.0")

PYTHON="${PYTHON:-python3}"
# pip does not widen an explicit --platform to older manylinux levels: name each one wheels use.
PLATFORMS=()
for level in 2_28 2_27 2_26 2_24 2_17; do PLATFORMS+=(--platform "manylinux_${level}_aarch64"); done
PLATFORMS+=(--platform manylinux2014_aarch64)
arm64_wheels() {  # arm64_wheels [--no-deps] SPEC...: into SITE, for CPython 3.11 on arm64
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-compile "${PLATFORMS[@]}" \
        --only-binary=:all: --python-version 3.11 --implementation cp --target "$CACHE/SITE" "$@"
}
gguf_wheels() {
    arm64_wheels "${GGUF_WHEELS[@]}"
    arm64_wheels --no-deps "${GGUF_NO_DEPS[@]}"
}
# Byte-compiled here, at native speed (bytecode is the same on every CPU for one Python version):
# the wheels and Debian's standard library (its .deb ships none; its maintainer scripts, not run
# here, would compile it). Under emulation compiling costs minutes on the first run, and every run
# that may not write bytecode pays it again: importing pytest took 5.9 s without, 2.2 s with.
STDLIB="$CACHE/ROOT/usr/lib/python3.11"
byte_compile() {
    if "$PYTHON" -c "import sys; sys.exit(sys.version_info[:2] != (3, 11))"; then
        "$PYTHON" -m compileall -q -j 0 "$CACHE/SITE" "$STDLIB" >/dev/null || true
    fi
}

if [ -f "$CACHE/READY" ]; then
    # A root prepared before gguf was part of it gains it in place (additive: a test using the root
    # meanwhile is not disturbed).
    if [ ! -d "$CACHE/SITE/gguf" ] || [ ! -d "$CACHE/SITE/accelerate" ]; then
        "$PYTHON" -m pip --version >/dev/null
        gguf_wheels
        byte_compile
        echo "arm64_root: added gguf and accelerate to $CACHE/SITE"
    elif [ ! -f "$STDLIB/__pycache__/os.cpython-311.pyc" ]; then  # a root prepared before it was
        byte_compile
        echo "arm64_root: byte-compiled $STDLIB"
    fi
    echo "arm64_root: ready in $CACHE"
    exit 0
fi
for tool in apt-get dpkg; do
    command -v "$tool" >/dev/null || { echo "arm64_root: $tool not found: Debian's tools are needed" >&2; exit 1; }
done
"$PYTHON" -m pip --version >/dev/null

rm -rf "$CACHE"
mkdir -p "$CACHE/apt/state/lists/partial" "$CACHE/apt/cache/archives/partial" "$CACHE/debs" "$CACHE/ROOT"
touch "$CACHE/apt/state/status"
start=$(date +%s)

# A private apt state that sees only arm64: the host's sources, lists kept in the cache.
APT=(-q -o "Dir::State=$CACHE/apt/state" -o "Dir::State::status=$CACHE/apt/state/status"
     -o "Dir::Cache=$CACHE/apt/cache" -o "APT::Architecture=arm64" -o "APT::Architectures::=arm64"
     -o "APT::Sandbox::User=root")
apt-get "${APT[@]}" update >/dev/null
(cd "$CACHE/debs" && apt-get "${APT[@]}" download "${DEBS[@]/%/:arm64}" >/dev/null)
for deb in "$CACHE"/debs/*.deb; do
    dpkg -x "$deb" "$CACHE/ROOT"
done
rm -rf "$CACHE/apt" "$CACHE/debs"

arm64_wheels "${WHEELS[@]}"
arm64_wheels --no-deps "torch==$TORCH_VERSION"
gguf_wheels
byte_compile
export QEMU_LD_PREFIX="$CACHE/ROOT"
if command -v qemu-aarch64 >/dev/null; then
    qemu-aarch64 "$CACHE/ROOT/usr/bin/python3.11" -c "import sys; print('arm64 python', sys.version.split()[0])"
fi
echo "torch $TORCH_VERSION (arm64, CPU) in $CACHE/SITE, Python in $CACHE/ROOT: $(( $(date +%s) - start )) s"
touch "$CACHE/READY"
