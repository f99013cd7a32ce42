"""The fixed-order kernel: oneDNN's AVX2 GEMM bits at native speed, in C (``chain_linear.c``).

It computes oneDNN's summation order exactly (``docs/design/kernels.md``) and is an accelerator,
never a new definition of the bits: each shape is checked against oneDNN on its first product and
on a sample of later ones, and stays on oneDNN where they differ. Compiled once with ``$CC`` into
the plugin's cache folder; where there is none, or it fails, the products stay on oneDNN.

Loading code from a cache folder is a trust boundary. The build is named by the SHA-256 of its own
bytes. It is loaded only from a folder that is the user's own, which neither group nor others may
write, inside a parent of the user's (or root's) that neither may write either (the check every
cache folder gets, ``private_folder.py``, here made on open descriptors); the library is
opened once, without following links, its owner, mode and bytes checked on that descriptor, and
``dlopen`` reads that same open file (``/proc/self/fd``): a file swapped after the check is never
the one loaded.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import random
import re
import shlex
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmdeterminism.compute import profiles
from pytest_llmdeterminism.compute.private_folder import CacheFolderError, private_folder, require_private

if TYPE_CHECKING:
    import torch

SOURCE = Path(__file__).with_name("chain_linear.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared")
# oneDNN's block of input features at two or more rows (docs/design/kernels.md).
ONEDNN_KBLOCK = 1024
# LLMDET_OWN_KERNELS=0 keeps every product on oneDNN (the same bits: for comparisons and benchmarks).
SWITCH = "LLMDET_OWN_KERNELS"
# About one product in RECHECK_EVERY of a checked shape is computed by the reference too, once the
# gaps have doubled up to it; then each gap is drawn around it, so that no layer of a model whose
# calls per step divide it is skipped at every step.
RECHECK_EVERY = 64
# The C function takes its sizes as ints and rounds the rows up to groups of 8.
_MAX_SIZE = 1 << 30
_REFUSED = "the plugin loads no code from it (the products stay on oneDNN)"
_FIX = f"{_REFUSED}: set LLMDET_CACHE_DIR to a private folder"

# (out features, in features, rows, bias, threads): a shape as the kernel runs it
Shape = tuple[int, int, int, bool, int]
Reference = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor | None"], "torch.Tensor"]

# The libraries this process loaded, by (device, inode). Each one's descriptor stays open: dlopen knows
# a library by the name it was opened as (/proc/self/fd/N), so no other file may take that number.
_LOADED: dict[tuple[int, int], ctypes.CDLL] = {}


def build(folder: Path) -> tuple[FixedOrderKernel | None, str]:
    """The kernel, compiled into ``folder`` unless a build of this source with these flags is there;
    or ``None`` and why not (no compiler, not x86-64, switched off, a folder others may write)."""
    import platform

    if os.environ.get(SWITCH, "1") == "0":
        return None, f"{SWITCH}=0"
    # the order of oneDNN's AVX2 kernels: where portable numerics run them (x86-64), on Linux
    if profiles.profile(profiles.PORTABLE).onednn_isa != profiles.ONEDNN_ISA or sys.platform != "linux":
        return None, f"built for Linux x86-64 only, not {sys.platform} {platform.machine()}"
    import xxhash

    stem = f"chain_linear-{xxhash.xxh3_64_hexdigest(SOURCE.read_bytes() + ' '.join(FLAGS).encode())}"
    try:
        opened = _open_build(folder, stem)
        if opened is None:
            if why := _compile(folder, stem):
                return None, why
            opened = _open_build(folder, stem)
        if opened is None:
            return None, f"the kernel built in {folder} is not there, or its bytes do not match its name"
        return FixedOrderKernel(_load(opened)), f"built in {folder}"
    except OSError as error:
        # A refusal (CacheFolderError) says what, why and the fix. Any other failure is the system's.
        if isinstance(error, CacheFolderError):
            return None, str(error)
        return None, f"the kernel in {folder} did not load ({error}); {_FIX}"


def _open_build(folder: Path, stem: str) -> int | None:
    """A descriptor of a build of ``stem`` in ``folder`` (``{stem}-{SHA-256 of its bytes}.so``), its
    owner, mode and bytes checked on that descriptor; None where there is none yet."""
    try:
        folder_fd = _open_private_folder(folder)
    except FileNotFoundError:
        return None
    try:
        for name in sorted(os.listdir(folder_fd)):
            named = re.fullmatch(rf"{re.escape(stem)}-([0-9a-f]{{64}})\.so", name)
            if named is None:
                continue
            # O_NONBLOCK: a FIFO of that name must not hang the open (it changes nothing for a file)
            fd = _open_unlinked(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                                folder_fd)
            try:
                status = os.fstat(fd)
                _require_private(status, folder / name)
                if not stat.S_ISREG(status.st_mode):
                    raise CacheFolderError(folder / name, f"{folder / name} is not a regular file; {_FIX}")
                if _sha256(fd) == named[1]:
                    return os.dup(fd)  # not inheritable (PEP 446), like the original
            finally:
                os.close(fd)
            # bytes that do not match the name (a torn write): compiled again
    finally:
        os.close(folder_fd)
    return None


def _open_private_folder(folder: Path) -> int:
    """A descriptor of ``folder``, opened from its parent's: both checked on their descriptors."""
    parent_fd = os.open(folder.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _require_private(os.fstat(parent_fd), folder.parent, " (the kernel folder's parent)",
                         ": whoever may write it can put another folder in the kernel folder's place",
                         root_too=True)
        fd = _open_unlinked(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, parent_fd)
    finally:
        os.close(parent_fd)
    try:
        _require_private(os.fstat(fd), folder)
    except PermissionError:
        os.close(fd)
        raise
    return fd


def _open_unlinked(path: Path, flags: int, folder_fd: int) -> int:
    """``path``'s last part opened in the folder open on ``folder_fd``; never through a symbolic link."""
    try:
        return os.open(path.name, flags, dir_fd=folder_fd)
    except OSError as error:  # ELOOP, or ENOTDIR where a folder was asked for
        if error.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(
                os.stat(path.name, dir_fd=folder_fd, follow_symlinks=False).st_mode):
            raise CacheFolderError(path, f"{path} is a symbolic link: the plugin follows no link to code it "
                                         f"loads; {_FIX}") from None
        raise


def _require_private(status: os.stat_result, path: Path, role: str = "", why: str = "", *,
                     root_too: bool = False) -> None:
    """The plugin's one check of a cache folder (``private_folder.py``), on what was opened here."""
    require_private(status, path, refused=_REFUSED, role=role, why=why, root_too=root_too)


def _sha256(fd: int) -> str:
    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def _load(fd: int) -> ctypes.CDLL:
    """The library open on ``fd``, loaded from that open file, not from its path; ``fd`` stays open
    (or is closed where this process loaded the same file already)."""
    status = os.fstat(fd)
    file = (status.st_dev, status.st_ino)
    if file in _LOADED:
        os.close(fd)
        return _LOADED[file]
    try:
        library = ctypes.CDLL(f"/proc/self/fd/{fd}")
    except OSError:
        os.close(fd)
        raise
    _LOADED[file] = library
    return library


def _compile(folder: Path, stem: str) -> str:
    """Compiles the kernel into ``folder`` as ``{stem}-{SHA-256 of its bytes}.so`` (beside it, then
    renamed into place); '' or why it failed."""
    command = os.environ.get("CC", "gcc")
    try:
        compiler = shlex.split(command) or ["gcc"]  # CC may be a command line: "ccache gcc"
    except ValueError as error:
        return f"CC={command!r} is not a command line ({error}): set CC to a C compiler, e.g. CC=gcc"
    try:
        private_folder(folder)
        with tempfile.TemporaryDirectory(dir=folder) as scratch:
            built = Path(scratch) / "chain_linear.so"
            done = subprocess.run([*compiler, *FLAGS, str(SOURCE), "-o", str(built)], capture_output=True,
                                  text=True, timeout=120, check=False)
            if done.returncode != 0:
                said = done.stderr.strip().splitlines()
                return f"{command} failed ({said[-1] if said else f'exit status {done.returncode}'})"
            built.chmod(0o755)  # not group-writable whatever the umask: _require_private would refuse it
            os.replace(built, folder / f"{stem}-{hashlib.sha256(built.read_bytes()).hexdigest()}.so")
    except (OSError, subprocess.SubprocessError) as error:
        return f"{command} could not build it: {error}"
    return ""


class FixedOrderKernel:
    """``F.linear`` for float32 on the CPU with the bits of oneDNN's AVX2 kernels (its GEMM and its
    one-row kernel), each shape checked against oneDNN on its first product and on a sample of the
    later ones, and used only while every check of it passed."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._function = library.chain_linear
        self._function.restype = ctypes.c_int
        self._function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 5
        self._chained_row = library.chain_linear_chained_row
        self._chained_row.restype = ctypes.c_int
        self._chained_row.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
        # shape -> whether every check of the kernel's bits there equalled the reference's
        self.checked: dict[Shape, bool] = {}
        # shape -> how many of its next products run unchecked; the last gap between its checks
        self._unchecked: dict[Shape, int] = {}
        self._gap: dict[Shape, int] = {}
        self._draw = random.Random(0)  # the same gaps in every run of the same products

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               reference: Reference) -> torch.Tensor:
        """``reference(x, weight, bias)``'s result, computed by the kernel where every check of the shape
        passed; a product that a check found different is never returned."""
        import torch

        if not _fits(x, weight, bias):
            return reference(x, weight, bias)
        out_features, in_features = weight.shape
        rows = x.numel() // in_features
        threads = torch.get_num_threads()
        shape = (out_features, in_features, rows, bias is not None, threads)
        if self.checked.get(shape) is False:
            return reference(x, weight, bias)
        y = self._run(x, weight, bias, rows, threads)
        unchecked = self._unchecked.get(shape, 0)
        if unchecked:
            self._unchecked[shape] = unchecked - 1
            return y
        expected = reference(x, weight, bias)
        self.checked[shape] = torch.equal(expected.view(torch.int32), y.view(torch.int32))
        self._unchecked[shape] = self._next_gap(shape)
        return expected

    def _next_gap(self, shape: Shape) -> int:
        """How many products of ``shape`` run unchecked after this check: 0 (the second product is
        checked), then 1, 2, 4, ... up to RECHECK_EVERY, then a draw around it."""
        last = self._gap.get(shape)
        gap = self._gap[shape] = 0 if last is None else min(max(2 * last, 1), RECHECK_EVERY)
        if gap < RECHECK_EVERY:
            return gap
        return self._draw.randrange(RECHECK_EVERY // 2, RECHECK_EVERY * 3 // 2)

    def _run(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int,
             threads: int) -> torch.Tensor:
        """The kernel's product; only for what ``_fits`` accepted."""
        import torch

        out_features, in_features = weight.shape
        y = torch.empty(*x.shape[:-1], out_features, dtype=torch.float32)
        if rows > 1 and x.dim() == 2 and x.stride(0) == 0:  # copies of one row (a lone row as a pair)
            # computed once, in the order of several rows, the lanes over outputs
            row, first = x[0].contiguous(), y[0]
            self._chained_row(row.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
                              first.data_ptr(), in_features, out_features, ONEDNN_KBLOCK, threads)
            y[1:] = first
            return y
        x = x.contiguous()
        if self._function(x.data_ptr(), weight.data_ptr(), bias.data_ptr() if bias is not None else None,
                          y.data_ptr(), rows, in_features, out_features, ONEDNN_KBLOCK, threads):
            raise MemoryError(f"chain_linear: no memory for a {rows}x{in_features} input")
        return y


def _fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether the C function may read these tensors and write their product, checked before a pointer
    goes to C (a torch extension's ``TORCH_CHECK``): strided float32 on the CPU, the weight a contiguous
    matrix whose input features are x's last dimension, the bias none or a contiguous vector of its
    output features, the sizes within a C int, no gradient to record. Anything else runs on the
    reference, which computes it or raises torch's own error, as without the kernel."""
    import torch

    # attribute by attribute, no generator: this runs on every product (about 1 us)
    float32, strided = torch.float32, torch.strided
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and weight.dim() == 2 and x.dim()
            and x.dtype is float32 and weight.dtype is float32 and x.layout is strided
            and weight.layout is strided and x.is_cpu and weight.is_cpu and weight.is_contiguous()):
        return False
    out_features, in_features = weight.shape
    if not (x.shape[-1] == in_features and 0 < in_features < _MAX_SIZE and 0 < out_features < _MAX_SIZE
            and 0 < x.numel() // in_features < _MAX_SIZE):
        return False
    if bias is not None and not (isinstance(bias, torch.Tensor) and bias.dtype is float32
                                 and bias.layout is strided and bias.is_cpu and bias.shape == (out_features,)
                                 and bias.is_contiguous()):
        return False
    # the kernel's product has no autograd graph
    return not (torch.is_grad_enabled()
                and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)))
