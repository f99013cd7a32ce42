"""llama-cpp-python's OpenAI-compatible server as a test starts it (the ``llama_server`` fixture)."""

from __future__ import annotations

from pathlib import Path

import pytest


class LlamaServer:
    """llama-cpp-python's OpenAI-compatible server, serving one GGUF file on a free localhost port."""

    def __init__(self, model: Path, log: Path) -> None:
        import socket
        import subprocess
        import sys

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
             "--port", str(self.port), "--n_threads", "1", "--n_ctx", "2048", "--seed", "0"],
            stdout=log.open("wb"), stderr=subprocess.STDOUT)
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
