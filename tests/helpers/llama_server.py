"""llama-cpp-python's OpenAI-compatible server as a test starts it (the ``llama_server`` fixture)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


class LlamaServer:
    """llama-cpp-python's OpenAI-compatible server, serving one GGUF file on a free localhost port."""

    def __init__(self, model: Path, log: Path) -> None:
        import sys

        self._start(lambda port: [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host",
                                  "127.0.0.1", "--port", str(port), "--n_threads", "1", "--n_ctx", "2048",
                                  "--seed", "0"], log)

    def _start(self, command: Callable[[int], list[str]], log: Path) -> None:
        """Run ``command(port)`` on a free localhost port, its output into ``log``, until it answers."""
        import socket
        import subprocess

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        self.process = subprocess.Popen(command(self.port), stdout=log.open("wb"), stderr=subprocess.STDOUT)
        self._wait_until_ready()

    def _wait_until_ready(self, seconds: float = 120.0) -> None:
        import time
        import urllib.request

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the llama.cpp server exited ({self.process.returncode}):\n"
                            f"{self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        pytest.fail(f"the llama.cpp server did not answer within {seconds:.0f} s:\n"
                    f"{self.log.read_text()[-2000:]}")

    def spec(self, tokenizer: Path) -> str:
        return f"openai:{self.url}#tokenizer={tokenizer}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


# llama.cpp's own server, built by scripts/llama_server.sh (the llama.cpp llama-cpp-python 0.3.36 vendors)
NATIVE_CACHE = Path.home() / ".cache" / "pytest-llmdeterminism" / "llama-server-0.3.36" / "llama-server"
NATIVE_MISSING = "llama.cpp's llama-server is not built: build it with scripts/llama_server.sh (.ci/run does)"
NATIVE_CTX_PER_SLOT = 512  # tokens per slot: the audit's companions and needles need under 100


def native_llama_server_path() -> Path | None:
    """``LLMDET_LLAMA_SERVER`` or the path scripts/llama_server.sh builds to; None where neither is."""
    import os

    given = os.environ.get("LLMDET_LLAMA_SERVER")
    path = Path(given) if given else NATIVE_CACHE
    return path if path.is_file() and os.access(path, os.X_OK) else None


class NativeLlamaServer(LlamaServer):
    """llama.cpp's ``llama-server`` serving one GGUF file on a free localhost port with ``parallel``
    slots (continuous batching on unless ``cont_batching=False``); the test skips where it is not
    built."""

    def __init__(self, model: Path, log: Path, *, parallel: int, cont_batching: bool = True,
                 extra: tuple[str, ...] = ()) -> None:
        binary = native_llama_server_path()
        if binary is None:
            pytest.skip(NATIVE_MISSING)
        self._start(lambda port: [str(binary), "--host", "127.0.0.1", "--port", str(port), "-m", str(model),
                                  "--parallel", str(parallel), "-cb" if cont_batching else "-nocb",
                                  "--threads", "1", "--ctx-size", str(NATIVE_CTX_PER_SLOT * parallel),
                                  "--seed", "0", "--no-webui", *extra], log)
