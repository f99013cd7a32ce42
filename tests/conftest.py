"""The suite's fixtures and hooks: the test tiers (by folder), the tiny model loaded once, the SmolLM2
GGUF file, a llama.cpp server, and the environment every test and the pytest runs it starts get.
What tests share besides fixtures is in ``tests.helpers``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import hypothesis
import pytest

from pytest_llmdeterminism.compute.private_folder import CACHE_SETTING, cache_root
from pytest_llmdeterminism.engines import BUILTIN_MODELS
from tests.helpers import forkserver
from tests.helpers.llama_server import LlamaServer
from tests.helpers.models import (
    GEMMA3_DEFAULT,
    GEMMA3_ENV,
    SMOLLM2_DEFAULT,
    SMOLLM2_ENV,
    checked_model,
)

# Two xdist workers share two cores, and their tests start child Pythons with torch's default thread
# count: OpenMP threads that spin while they wait for work take cycles the other process needs
# (emulated ones too). Waiting passively changes no bits; it is set before torch loads here, and
# every child inherits it. Measured: the two batch-invariant example-suite tests, 110 -> 99 CPU s.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The suite starts ~230 child Pythons (pytester subprocesses, xdist workers, emulated runs). Where
# the machine sets PYTHONDONTWRITEBYTECODE (this project's machines do), each child would
# compile its modules again, and pytest would rewrite for assertions the ~130 modules of its plugins
# (hypothesis, xdist, anyio, this one; the rewrite's cache is bytecode): measured ~0.5 s of a ~6 s
# child natively, and several seconds of each emulated one. Children cache their bytecode instead.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# Most of a child pytest run is its start: the child Pythons this process's tests start (`-m pytest`,
# `-m pytest_llmdeterminism.cli`, `-c`, scripts) begin as forks of one that imported torch and transformers
# (tests/helpers/forkserver.py says what is shared and what is not; LLMDET_TEST_FORKSERVER=0 turns it off).
FORK_SERVERS = forkserver.install()
# pytester gives each test its own HOME, and with it the plugin's default cache folder: every project a
# test runs, and each of its xdist workers, compiled the fixed-order kernel again (0.7 CPU s; ~150 times a
# run). They share this user's cache folder instead, as a user's runs do; a test of the cache itself
# names its own folder (LLMDET_CACHE_DIR), as before.
os.environ.setdefault(CACHE_SETTING, str(cache_root()))
# Hypothesis's default 200 ms deadline per example is a wall-clock threshold, which this suite keeps out
# of its tests (speed is measured in benchmarks/): on a shared 2-core machine the first example of a
# worker's first property test can take longer (2026-12-08: two comparator tests failed so in a child
# run under CI load, and passed alone). Examples are still bounded by pytest-timeout.
hypothesis.settings.register_profile("suite", deadline=None)
hypothesis.settings.load_profile("suite")

# Test tiers (pyproject.toml registers the markers; CONTRIBUTING.md gives the loops' commands). A test
# lives in the folder of its heaviest tier, so `pytest tests/unit` is the inner loop and `pytest
# tests/pytester -m "not subprocess"` the workflow loop. Its markers: its folder's tier (what it needs
# is a machine's, not a fixture's: qemu, llama.cpp), the tiers of the fixtures it uses, and the marks
# written on it (subprocess: it starts pytest in a child process, which a fixture below checks).
TIER_FOLDERS = ("emulated", "slow", "engines", "real_model", "pytester", "unit")  # heaviest first
FOLDER_OF_TIER = {"subprocess": "pytester"}  # child-process runs live beside the in-process ones
TIER_BY_FIXTURE = {
    "pytester": "pytester",  # runs pytest on a project it writes, in this process or a child
    "smollm2_gguf": "real_model",  # the real SmolLM2-135M
    "gemma3_gguf": "real_model",  # the real Gemma 3 270M
    "llama_server": "engines",  # a llama.cpp OpenAI-compatible server process
}
MARKED_BY_FOLDER = ("emulated", "slow", "engines", "real_model")  # pytester/ holds subprocess ones too
TESTS = Path(__file__).parent


def _folder(item: pytest.Item) -> str:
    """The tier folder ``item`` lives in (its first folder under tests/), or ``""``."""
    parts = item.path.relative_to(TESTS).parts if item.path.is_relative_to(TESTS) else ()
    return parts[0] if len(parts) > 1 else ""


def _belongs_in(item: pytest.Item) -> str:
    """The folder of the heaviest tier ``item`` is marked with."""
    folders = {FOLDER_OF_TIER.get(mark.name, mark.name) for mark in item.iter_markers()}
    return next(folder for folder in TIER_FOLDERS if folder in folders or folder == "unit")


# The order tests start in: the longest first, so that under xdist (one test at a time to each
# worker, --maxschedchunk=1) the last minutes are short tests that both workers share, not one
# worker's emulated run while the other idles (longest processing time first). A tier's tests take,
# in wall time: emulated 1-3 min each, real-model and engine ones 10 s to 1.5 min, child-process ones
# 5 s to 1 min, the rest mostly under a second. Within a tier, collection order.
START_ORDER = ("emulated", "slow", "real_model", "engines", "subprocess")


def _start_rank(item: pytest.Item) -> int:
    return next((rank for rank, tier in enumerate(START_ORDER) if item.get_closest_marker(tier)),
                len(START_ORDER))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        tiers = {tier for fixture, tier in TIER_BY_FIXTURE.items() if fixture in fixtures}
        if _folder(item) in MARKED_BY_FOLDER:
            tiers.add(_folder(item))
        for tier in sorted(tiers):
            item.add_marker(tier)
    items.sort(key=_start_rank)  # stable: every xdist worker collects the same order


@pytest.fixture(autouse=True)
def _in_its_tier_folder(request):
    """A test lives in the folder of its heaviest tier: one that uses ``pytester`` (or is marked
    ``subprocess``) in tests/unit would slow the inner loop unnoticed, so it fails saying where it goes.
    (First of the autouse fixtures: nothing heavy is set up for a test in the wrong place.)"""
    folder, belongs = _folder(request.node), _belongs_in(request.node)
    if folder != belongs:
        pytest.fail(f"{request.node.nodeid} belongs in tests/{belongs}/, the folder of its heaviest tier "
                    "(tests/conftest.py, TIER_FOLDERS): move it there", pytrace=False)


@pytest.fixture(autouse=True)
def _not_in_ci(monkeypatch):
    """The suite itself runs in CI (CI=true), where the plugin refuses to write goldens; the
    pytester projects it creates are developer workflows, so they run without CI set."""
    monkeypatch.delenv("CI", raising=False)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` for this suite: one worker more than the usable cores (``--maxprocesses=4`` caps it).
    With one worker a core, the cores stood idle ~14 % of the run (measured: 186 % of two cores busy)
    while tests waited for child Pythons to start, servers to answer and deadlines to run out; a third
    worker's tests take that time."""
    from pytest_llmdeterminism.compute.threads import usable_cores

    return usable_cores() + 1


@pytest.fixture(autouse=True)
def _fresh_python(request):
    """A test marked ``fresh_python`` tests what a new Python imports: its children are not forks."""
    if FORK_SERVERS is None or request.node.get_closest_marker("fresh_python") is None:
        yield
        return
    with FORK_SERVERS.fresh():
        yield


@pytest.fixture(autouse=True)
def _heavy_libraries_before_pytester(request):
    """Tests that run pytest in-process get torch imported first; unit tests load nothing."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("_import_heavy_libraries_once")


@pytest.fixture(autouse=True)
def _child_pytest_runs_are_marked(request, monkeypatch, _heavy_libraries_before_pytester):
    """The inner loop deselects ``subprocess`` tests: one that starts pytest in a child process
    without the mark would slow it unnoticed, so it fails saying what to add. (After the heavy
    libraries: pytester's snapshot of ``sys.modules`` must already hold them.)"""
    if "pytester" in request.fixturenames and request.node.get_closest_marker("subprocess") is None:
        def unmarked(*args, **kwargs):
            __tracebackhide__ = True
            pytest.fail(f"{request.node.name} runs pytest in a child process: mark it "
                        "@pytest.mark.subprocess (pyproject.toml lists the test tiers)", pytrace=False)

        monkeypatch.setattr(request.getfixturevalue("pytester"), "runpytest_subprocess", unmarked)


@pytest.fixture(autouse=True)
def _projects_run_as_plain_runs(request, monkeypatch):
    """A project a test runs (in-process or as a child ``python -m pytest``) is a plain pytest run
    whatever ``-n`` this suite runs under: an xdist worker's count in the environment would give it
    a worker's share of the cores (compute/threads.py), and its goldens another thread count. A
    child run with ``-n`` gets its own count from xdist. Nor does it inherit the OMP_NUM_THREADS the
    plugin set for this suite's own worker, which it would read as the user's choice."""
    from pytest_llmdeterminism import plugin

    for name in ("PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    environment = request.config.stash.get(plugin._ENVIRONMENT, None)
    if environment is not None and environment.threads.set_by_plugin:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        if "pytester" in request.fixturenames:
            # An in-process run reads torch's live thread count as torch's default: give it the
            # default of a plain run (the usable cores), and this worker its share back afterwards.
            import torch

            from pytest_llmdeterminism.compute.threads import usable_cores

            before = torch.get_num_threads()
            torch.set_num_threads(usable_cores())
            request.addfinalizer(lambda: torch.set_num_threads(before))


# pytest's unraisableexception plugin collects garbage twice as a run ends, over every object torch and
# transformers made: measured 0.35-0.45 s of a ~4.5 s child run natively (0.8 s of a "-n 2" one), and
# the suite starts ~190 native children. It only turns an exception raised in a finaliser into a
# warning, which no test reads: the suite's own workers keep it, the runs its tests start go without.
# Nor do they load Hypothesis's and anyio's plugins (the test extra installs both; no project a test
# runs uses either): at start-up the one imports most of Hypothesis, the other trio, 0.4 of the ~0.9
# CPU s a bare child pytest takes to start (measured), in every child and xdist worker, and several
# seconds under emulation. A run that needs one names it (-p hypothesispytest: test_examples.py).
CHILD_PYTEST_ADDOPTS = "-p no:unraisableexception -p no:hypothesispytest -p no:anyio"


@pytest.fixture(autouse=True)
def _child_runs_as_written(request, monkeypatch):
    """pytest-randomly (in the test extra) would shuffle every project pytester runs: they keep the
    order they are written in unless a test asks for it with ``-p randomly``
    (tests/pytester/test_neighbours.py).
    Set after pytester's own setup, which clears ``PYTEST_ADDOPTS``. Every child pytest, pytester's or
    a test's own, runs without the unraisableexception plugin (``CHILD_PYTEST_ADDOPTS``)."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")
        monkeypatch.setenv("PYTEST_ADDOPTS", f"-p no:randomly {CHILD_PYTEST_ADDOPTS}")
    else:
        given = os.environ.get("PYTEST_ADDOPTS", "")
        monkeypatch.setenv("PYTEST_ADDOPTS", f"{given} {CHILD_PYTEST_ADDOPTS}".strip())


@pytest.fixture(scope="session")
def _import_heavy_libraries_once(tiny):
    """Load and run the tiny model before any in-process pytester run.

    pytester restores ``sys.modules`` after each in-process run, dropping every module the run
    imported. Re-importing torch in the same process crashes it, so every torch/transformers
    module a run can touch must already be imported here, where pytester's snapshot keeps it.
    """
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    LLMModel(tiny, GenerationSettings(BatchShape(1, 8), 1, 0)).generate("x")
    import safetensors.torch  # noqa: F401  (used by perturbed copies)


@pytest.fixture(scope="session")
def tiny():
    """The built-in tiny model, loaded once for the in-process tests."""
    from pytest_llmdeterminism.engines import load

    return load("builtin:tiny", dtype="float32", device="cpu")


@pytest.fixture
def make_llm(tiny):
    """Build an LLMModel view on the tiny model with a given shape and token budget."""
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    def make(shape: str = "4x32", max_new_tokens: int = 12, seed: int = 0) -> LLMModel:
        return LLMModel(tiny, GenerationSettings(BatchShape.parse(shape), max_new_tokens, seed))

    return make


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face hub cache for this test: ``HF_HUB_CACHE`` for the runs it starts in a
    child process, and huggingface_hub's constant for this one (the library reads the variable once,
    when it is imported, and this process imported it long ago)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture(scope="session")
def wide_model(tmp_path_factory):
    """The tiny model's tokenizer on a wider random Llama (hidden 1024): layers the one-row split applies
    to (test_linears.py), products oneDNN computes at 4 rows and in prefill (test_fixed_order.py)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("wide")
    tiny = BUILTIN_MODELS["tiny"]
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny / name, folder / name)
    config = AutoConfig.from_pretrained(tiny, local_files_only=True)
    config.update({"hidden_size": 1024, "intermediate_size": 2048, "num_attention_heads": 16,
                   "num_key_value_heads": 4, "head_dim": 64, "num_hidden_layers": 2,
                   "tie_word_embeddings": False})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    return fetched_model("smollm2", SMOLLM2_ENV, SMOLLM2_DEFAULT)


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    return fetched_model("gemma3", GEMMA3_ENV, GEMMA3_DEFAULT)


def fetched_model(name: str, setting: str, default: Path) -> Path:
    """The file ``llm-golden fetch NAME`` puts in ``default`` (or ``$setting`` names), checked against its
    pinned SHA-256; the test skips, saying how to fetch it, where there is none."""
    path = Path(os.environ.get(setting, default))
    if not path.is_file():
        pytest.skip(f"{name} GGUF not found at {path}: run .ci/run (it fetches it) or "
                    f"llm-golden fetch {name} {path.parent}, or set {setting}")
    return checked_model(name, path)


@pytest.fixture
def suite(pytester):
    """A pytester project configured for the tiny model."""
    pytester.makeini("[pytest]\nllm_model = builtin:tiny\nllm_batch_shape = 4x32\nllm_max_new_tokens = 8\n")
    return pytester


@pytest.fixture
def llama_server(tmp_path_factory):
    """Start servers with ``llama_server(model_path)``; each is killed when the test ends."""
    pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is not installed: "
                        "CMAKE_ARGS=-DGGML_NATIVE=OFF pip install -e '.[llamacpp]' (.ci/run does)")
    started: list[LlamaServer] = []

    def start(model: Path) -> LlamaServer:
        started.append(LlamaServer(model, tmp_path_factory.mktemp("server") / "server.log"))
        return started[-1]

    yield start
    for server in started:
        server.stop()


# -- fixtures shared by the tests of one subject in several tiers or packages -----------------------------


@pytest.fixture
def previous_kernels(tiny):
    """The tiny model on the previous kernels (llm_batch_invariant = false) for one test: there the
    batch shape moves a prompt's logits, and a lone prompt is a plain generate() of it."""
    from pytest_llmdeterminism.compute.kernels import Policy
    from tests.helpers.batch_invariant import on_policy

    with on_policy(tiny, Policy.ONEDNN_AVX2):
        yield


@pytest.fixture(scope="module")
def kernels_folder(tmp_path_factory):
    """A folder with the fixed-order kernel built in it (test_fixed_order.py)."""
    from pytest_llmdeterminism.compute import fixed_order

    folder = tmp_path_factory.mktemp("kernels")
    built, why = fixed_order.build(folder)
    assert built is not None, why
    return folder


@pytest.fixture(scope="module")
def kernel(kernels_folder):
    from pytest_llmdeterminism.compute import fixed_order

    return fixed_order.build(kernels_folder)[0]


@pytest.fixture
def gguf_and_cache(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """The tiny ``.gguf`` file and a plugin cache (``LLMDET_CACHE_DIR``) with no converted copy, only the
    built kernel (test_cached.py)."""
    from tests.helpers.converted_copy import tiny_gguf, with_built_kernel

    with_built_kernel(tmp_path / "cache")
    monkeypatch.setenv("LLMDET_CACHE_DIR", str(tmp_path / "cache"))
    return tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "cache" / "converted"


@pytest.fixture
def serve():
    """Start fake OpenAI-compatible servers with ``serve(answer)``; each stops when the test ends
    (test_hostile_server.py, test_hostile_server_runs.py)."""
    from tests.helpers.fake_openai_server import FakeServer

    servers: list[FakeServer] = []

    def start(answer) -> FakeServer:
        servers.append(FakeServer(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def pieces():
    """The tiny tokenizer's text of each token a fake server answers with (test_hostile_server.py,
    test_hostile_server_runs.py, test_serving_audit.py)."""
    from pytest_llmdeterminism.engines.checkpoint import load_tokenizer
    from tests.helpers.hostile_server import GREEDY, TINY

    tokenizer = load_tokenizer("tiny", TINY)
    return {i: tokenizer.decode([i]) for i in GREEDY}
