"""Any OpenAI-compatible server (``openai:URL#model=NAME&tokenizer=PATH``): the model as it is served.

A server returns token texts and top-k logprobs, never raw logits: they are recorded under
:data:`~generation.SERVED_HASH_DEFINITION`, with the served model's local tokenizer (``tokenizer=``)
mapping texts back to ids. Requests are pinned greedy, one at a time, each after a prefix reset
(``reset_prefix=1``); the server is an untrusted peer (``server_client.py``) whose every answer is
checked before anything is recorded (``completions.py``). What is pinned, checked and measured:
``docs/design/engines.md``.
"""

from __future__ import annotations

import copy as copy_module
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_llmdeterminism.decoding import DecodingConfig, refuse_beyond
from pytest_llmdeterminism.engines.capture import Chunk, ScoreChunk
from pytest_llmdeterminism.engines.checkpoint import checkpoint_eos_ids, load_tokenizer
from pytest_llmdeterminism.engines.fingerprints import described
from pytest_llmdeterminism.engines.loaded import LoadedModel, LoadRequest
from pytest_llmdeterminism.engines.server.completions import (
    Completion,
    ModelList,
    exact_id,
    parse_choice,
    request_body,
    text_only_id,
)
from pytest_llmdeterminism.engines.server.prompts import IdsOrText
from pytest_llmdeterminism.engines.server.secret import Secret
from pytest_llmdeterminism.engines.server.server_client import Client, check_url
from pytest_llmdeterminism.engines.server.server_score import ServedScores
from pytest_llmdeterminism.engines.spec import EngineSpec, refuse_credentials
from pytest_llmdeterminism.errors import ConfigurationError, ModelLoadError
from pytest_llmdeterminism.generation import HashDefinition
from pytest_llmdeterminism.shape import GenerationSettings

__all__ = ["OpenAIEngine", "OpenAIOptions", "load"]

SHOWN_MODELS = 20  # of a server's model names in a message


@dataclass(frozen=True)
class OpenAIOptions:
    """The spec's ``#key=value`` options. The API key is read from the environment variable
    ``api_key_env`` names: a key never sits in a spec, which the header, the load line and every
    error show."""

    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "unknown"
    timeout: float = 120.0
    max_response_mb: float = 16.0
    api_key_env: str | None = None
    reset_prefix: bool = True
    slots: int = 0  # requests the server computes at once (llama.cpp: --parallel); 0: not said


def load(spec: EngineSpec, request: LoadRequest) -> LoadedModel:
    """``openai:URL#...``, loaded: the server is asked for its models once."""
    __tracebackhide__ = True
    dtype = request.dtype
    refuse_credentials(spec.text)  # before anything prints the spec
    check_url(spec.text, spec.target)
    knobs = spec.options(OpenAIOptions)
    for knob, value, example in (("timeout", knobs.timeout, "300"),
                                 ("max_response_mb", knobs.max_response_mb, "64")):
        if not (math.isfinite(value) and value > 0):
            raise ConfigurationError("llm_model", spec.text, f"option {knob}={spec.given(knob)!r} must be a "
                                     f"positive number, e.g. #{knob}={example}")
    if knobs.tokenizer is None:
        raise ConfigurationError("llm_model", spec.text, "name the served model's tokenizer, a local folder "
                                 "or .gguf file: openai:URL#model=NAME&tokenizer=PATH (the plugin tokenises "
                                 "prompts and maps returned tokens to ids with it; it never downloads one)")
    if dtype != "float32":
        raise ConfigurationError("llm_dtype", dtype, "a server runs in its own dtype; say which in the spec "
                                 f"(openai:URL#tokenizer=PATH&dtype={dtype}: recorded, and it sets the tie "
                                 "margin)")
    tokenizer_path = Path(knobs.tokenizer)
    if not tokenizer_path.exists():
        raise ModelLoadError(spec.text, f"no such tokenizer folder or .gguf file: {knobs.tokenizer!r}")
    api_key = None
    if knobs.api_key_env is not None:
        api_key = Secret(os.environ.get(knobs.api_key_env, ""))  # never a plain string in this frame
        if not api_key:
            raise ConfigurationError("llm_model", spec.text, f"api_key_env={knobs.api_key_env} names an "
                                     "environment variable that is not set")
        problem = api_key.problem()
        if problem is not None:
            raise ConfigurationError("llm_model", spec.text, f"the key in ${knobs.api_key_env} {problem}, "
                                     "which no HTTP header can carry; set it to the key alone")
    client = Client(spec.text, spec.target, timeout=knobs.timeout, max_bytes=int(knobs.max_response_mb * 1e6),
                    api_key=api_key)
    served = [client.redact(m.id) for m in client.get("models", ModelList).data]
    model = knobs.model
    if model is None and len(served) == 1:
        model = served[0]
    if model is None or (served and model not in served):
        raise ConfigurationError("llm_model", spec.text, f"the server serves {_listed(served)}; name one "
                                 "with #model=NAME")
    version = client.version()
    tokenizer = load_tokenizer(spec.text, tokenizer_path)
    describe = {
        "engine": "openai",
        "device_class": "served",
        "dtype": knobs.dtype,  # what the server runs: unknown to the client unless the spec says
        "server": client.base,
        "server_model": model,
        "server_version": version,
        "reset_prefix": knobs.reset_prefix,
        "rows_alone": True,  # one request at a time
        "model": model,
        "weights_file": None,
    }
    # A tokenizer folder's generation config names the stop tokens, as it does for transformers.
    eos = checkpoint_eos_ids(tokenizer_path, tokenizer) if tokenizer_path.is_dir() else None
    if knobs.slots < 0:
        raise ConfigurationError("llm_model", spec.text, f"option slots={spec.given('slots')!r} must be the "
                                 "server's number of slots (llama.cpp's --parallel), e.g. #slots=4")
    engine = OpenAIEngine(spec.text, client, model, tokenizer, reset_prefix=knobs.reset_prefix, eos=eos,
                          slots=knobs.slots, version=version)
    return LoadedModel(spec=spec.text, kind="openai", path=tokenizer_path, model=client, tokenizer=tokenizer,
                       dtype=knobs.dtype, device="served", engine=engine, describe=describe)


def _listed(models: list[str]) -> str:
    """The served model names as a message shows them: the first :data:`SHOWN_MODELS`, then a count."""
    if not models:
        return "no models"
    shown = repr(models[:SHOWN_MODELS])
    more = len(models) - SHOWN_MODELS
    return shown if more <= 0 else f"{shown[:-1]}, ... and {more} more]"


class OpenAIEngine(IdsOrText):
    name = "openai"
    hash_definition = HashDefinition.SERVED_TOPK
    runs_rows_alone = True  # one request at a time
    # a server samples with its own generator: do_sample=True sends it the request's seed, once the
    # server is verified to draw per request (model/served_sampling.py)
    owns_sampling = False
    supports_audit = False

    def __init__(self, spec: str, client: Client, model: str, tokenizer: Any, *, reset_prefix: bool = True,
                 eos: list[int] | None = None, slots: int = 0, version: str | None = None) -> None:
        self._spec, self._client, self._model, self._tokenizer = spec, client, model, tokenizer
        # what a golden drawn by this server records as its sampler: the API, and the server's version
        # where it says one (its draw is its own; another version may draw otherwise)
        self.sampler = f"engine:{self.name}" + (f"@{version}" if version else "")
        self._reset_prefix = reset_prefix
        self._cache_prompt = False
        self.slots = slots  # the serving audit's most companions; 0: the spec does not say
        own = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
        self._eos = eos if eos is not None else own
        self._zero: list[int] | None = None  # the first token of "0", once
        self._ids: dict[str, int] | None = None
        self._scores: ServedScores | None = None  # llm_model.score's requests (server_score.py)

    def _other_start(self, ids: list[int]) -> str:
        """A one-token prompt that shares no first token with ``ids`` (past a BOS both would have)."""
        first = next((t for t in ids if t != self._tokenizer.bos_token_id), None)
        if self._zero is None:
            self._zero = list(self._tokenizer("0", add_special_tokens=False)["input_ids"][:1])
        return "1" if self._zero == [first] else "0"

    def eos_token_ids(self) -> list[int]:
        return list(self._eos)

    @property
    def resets_prefix(self) -> bool:
        return self._reset_prefix

    def as_served(self, ids: list[int]) -> list[int]:
        """``ids`` as the server will count them: themselves where it takes token ids, else the local
        tokenizer's ids of their text (random ids rarely survive a trip through text)."""
        if self._send_ids:
            return list(ids)
        return [int(t) for t in self._tokenizer(self._tokenizer.decode(ids))["input_ids"]]

    def with_prefix_cache(self) -> OpenAIEngine:
        """This engine with the server's prefix cache left on (no reset request, ``cache_prompt=true``):
        the serving audit's ``prefix-cache`` row, never a golden."""
        copy = copy_module.copy(self)
        copy._reset_prefix, copy._cache_prompt = False, True
        return copy

    def among_companions(self) -> OpenAIEngine:
        """This engine for a request sent among concurrent companions: a transport failure fails that
        request alone (:meth:`Client.apart`), never every later test of the session."""
        copy = copy_module.copy(self)
        copy._client = self._client.apart()
        return copy

    def score(self, rows: list[tuple[list[int], list[int]]], settings: GenerationSettings, *,
              top_k: int, prompt_logprobs: bool) -> ScoreChunk:
        """Each pair through ``/v1/completions`` with ``echo=true`` (``server_score.py``)."""
        __tracebackhide__ = True
        if self._scores is None:
            reset = (lambda ids: self._client.post("completions", {
                "model": self._model, "prompt": self._other_start(ids), "max_tokens": 1, "temperature": 0.0},
                object)) if self._reset_prefix else None
            self._scores = ServedScores(self._spec, self._client, self._model, self._tokenizer,
                                        token_id=self.token_id, reset=reset)
        return self._scores.score(rows, top_k=top_k, prompt_logprobs=prompt_logprobs)

    def vocab_size(self) -> int:
        return len(self._tokenizer)

    def fingerprint(self, loaded: LoadedModel) -> dict[str, Any]:
        """What its load described (version, pinned knobs), plus the model's hashes."""
        return described(loaded)

    def run(self, rows: list[list[int]], config: DecodingConfig, settings: GenerationSettings,
            keep_logits: bool) -> Chunk:
        __tracebackhide__ = True
        refuse_beyond("an OpenAI-compatible server", config, keep_logits=keep_logits, has_logits=False,
                      logprobs_after_penalties=False)
        out = Chunk(tokens=[], steps=[], texts=[], pieces=[], finish_reasons=[])
        request = self._client.request_line("POST", "completions")
        source = f"the server at {self._client.base}, answering {request},"
        for row_index, ids in enumerate(rows):
            if self._reset_prefix:
                self._client.post("completions", {"model": self._model, "prompt": self._other_start(ids),
                                                  "max_tokens": 1, "temperature": 0.0}, object)
            seed = settings.seed if config.sampling is None else config.seed_of(row_index)
            response = self._complete(ids, config, seed)
            row = parse_choice(self._spec, response, prompt_tokens=len(ids),
                               max_tokens=config.max_new_tokens, vocab_size=self.vocab_size(),
                               token_id=self.token_id, tokenizer=self._tokenizer, source=source,
                               model=self._model, secret=self._client.api_key,
                               sampled=config.sampling is not None)
            out.tokens.append(row.tokens)
            out.steps.append(row.steps)
            assert out.texts is not None and out.pieces is not None and out.finish_reasons is not None
            out.texts.append(row.text)
            out.pieces.append(row.pieces)
            out.finish_reasons.append(row.finish_reason)
            fingerprint = response.system_fingerprint and self._client.redact(response.system_fingerprint)
            temperature = 0 if config.sampling is None else config.sampling.temperature
            out.flags = {"system_fingerprint": fingerprint, "temperature": temperature,
                         "requests": "one at a time",
                         "prompt_sent_as": self._sent_as}
        return out

    def _complete(self, ids: list[int], config: DecodingConfig, seed: int) -> Completion:
        """The completion, the prompt sent as its token ids where the server takes them (the API allows
        it; vLLM does), else as text, which the server tokenises (llama-cpp-python). Only an error
        answer to the first id prompt that says the server takes no such prompt
        (:func:`~completions.refuses_token_ids`) switches to text, for the session; any other is raised
        as it is (a transient status after its retries)."""
        __tracebackhide__ = True
        return self._post_prompt(ids, lambda prompt: request_body(self._model, prompt, config, seed,
                                                                  cache_prompt=self._cache_prompt))

    def token_id(self, text: str) -> int:
        """The local tokenizer's id for a returned token text: ``token_id:N`` as vLLM returns it (asked
        with ``return_tokens_as_token_ids``), else the one token that decodes to it (the lowest id if
        several do), else a stable id above the vocabulary (``TEXT_ONLY_IDS``)."""
        exact = exact_id(text)
        if exact is not None:
            return exact
        if self._ids is None:
            pieces = self._tokenizer.batch_decode([[i] for i in range(len(self._tokenizer))])
            self._ids = {}
            for index, piece in enumerate(pieces):
                self._ids.setdefault(piece, index)
        return self._ids.get(text, text_only_id(text))
