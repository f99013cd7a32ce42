"""Any OpenAI-compatible server (``openai:URL#model=NAME&tokenizer=PATH``): the model as it is served.

A server returns tokens as text and the top-k logprobs of each step, never raw logits, so that is
what gets recorded: the step hash is :data:`~generation.SERVED_HASH_DEFINITION` (over the returned
texts and logprobs), and a golden says so; hashes of two definitions are never compared.

The plugin needs the served model's tokenizer locally (``tokenizer=``: a folder or ``.gguf``): it
tokenises prompts and renders chat templates exactly as the transformers backend does, and maps
each returned token text back to its id, so goldens of a server and of an in-process engine line
up. Each request is checked: the server must count the prompt's tokens as the local tokenizer does,
and each step's token must be the best of the returned top-k (greedy), else the test fails naming
what to check.

Pinned per request, one request at a time: ``temperature=0``, ``top_p=1``, no penalties
(``frequency_penalty``/``presence_penalty`` 0, and the llama.cpp and vLLM extensions
``repeat_penalty``/``repetition_penalty`` 1: llama-cpp-python's server defaults to 1.1), ``n=1``,
the test's ``seed``, ``logprobs=5``, ``cache_prompt=false`` (llama.cpp's own server). Recorded: the
served model id, the server's version where it offers ``/version``, and each response's
``system_fingerprint``.

A server may reuse the previous request's prompt cache for a shared prefix, and then evaluates
the rest of the prompt in another split, with other numerics: llama-cpp-python's server always
does (measured on SmolLM2 Q4_1: the same request gives logprob -1.6317 after itself and -1.7045
after another prompt), so a golden would depend on the order tests ran in. Before each request
the plugin therefore sends a one-token request that starts with another token (``reset_prefix=1``,
the default; ``#reset_prefix=0`` turns it off), so every prompt is evaluated whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pytest_llmdeterminism.backends.hf import checkpoint_eos_ids, load_tokenizer
from pytest_llmdeterminism.capture import Chunk, RowSteps
from pytest_llmdeterminism.errors import ConfigurationError, EngineError, ModelLoadError
from pytest_llmdeterminism.generation import TEXT_ONLY_IDS, TOP_K, refuse_beyond
from pytest_llmdeterminism.values import GenerationSettings, engine_params, flag

# The API key is read from the environment variable ``api_key_env`` names: a key never sits in a
# spec, which the header, the load line and every error show.
KNOBS: dict[str, tuple[Any, Any]] = {"model": (str, None), "tokenizer": (str, None), "dtype": (str, "unknown"),
                                     "timeout": (float, 120.0), "api_key_env": (str, None),
                                     "reset_prefix": (flag, True)}
GREEDY_SLACK = 1e-6  # a returned logprob may be rounded: the chosen token may trail the best by this


def load(spec: str, target: str, params: dict[str, str], *, dtype: str, device: str) -> dict[str, Any]:
    """The LoadedModel fields for ``openai:URL#...``: the server is asked for its models once."""
    __tracebackhide__ = True
    knobs = engine_params(spec, params, KNOBS)
    if not target.startswith(("http://", "https://")):
        raise ConfigurationError("llm_model", spec, f"{target!r} is not an http:// or https:// URL; expected "
                                 "openai:http://HOST:PORT/v1#tokenizer=PATH (and &model=NAME if it serves several)")
    if knobs["tokenizer"] is None:
        raise ConfigurationError("llm_model", spec, "name the served model's tokenizer, a local folder or .gguf "
                                 "file: openai:URL#model=NAME&tokenizer=PATH (the plugin tokenises prompts and "
                                 "maps returned tokens to ids with it; it never downloads one)")
    if dtype != "float32":
        raise ConfigurationError("llm_dtype", dtype, "a server runs in its own dtype; say which in the spec "
                                 f"(openai:URL#tokenizer=PATH&dtype={dtype}: recorded, and it sets the tie margin)")
    tokenizer_path = Path(knobs["tokenizer"])
    if not tokenizer_path.exists():
        raise ModelLoadError(spec, f"no such tokenizer folder or .gguf file: {knobs['tokenizer']!r}")
    api_key = None
    if knobs["api_key_env"] is not None:
        api_key = os.environ.get(knobs["api_key_env"])
        if not api_key:
            raise ConfigurationError("llm_model", spec, f"api_key_env={knobs['api_key_env']} names an environment "
                                     "variable that is not set")
    client = Client(spec, target.rstrip("/"), knobs["timeout"], api_key)
    served = [str(m.get("id")) for m in client.get("models").get("data", []) if isinstance(m, dict)]
    model = knobs["model"]
    if model is None and len(served) == 1:
        model = served[0]
    if model is None or (served and model not in served):
        raise ConfigurationError("llm_model", spec, f"the server serves {served or 'no models'}; name one "
                                 "with #model=NAME")
    version = client.version()
    tokenizer = load_tokenizer(spec, tokenizer_path)
    describe = {
        "engine": "openai",
        "device_class": "served",
        "dtype": knobs["dtype"],  # what the server runs: unknown to the client unless the spec says
        "server": target,
        "server_model": model,
        "server_version": version,
        "reset_prefix": knobs["reset_prefix"],
        "rows_alone": True,  # one request at a time
        "model": model,
        "weights_file": None,
    }
    # A tokenizer folder's generation config names the stop tokens, as it does for transformers.
    eos = checkpoint_eos_ids(tokenizer_path, tokenizer) if tokenizer_path.is_dir() else None
    engine = OpenAIEngine(spec, client, model, tokenizer, reset_prefix=knobs["reset_prefix"], eos=eos)
    return {"kind": "openai", "path": tokenizer_path, "model": client, "tokenizer": tokenizer, "dtype": knobs["dtype"],
            "device": "served", "engine": engine, "describe": describe}


class Client:
    """Plain JSON over HTTP (urllib: no dependency). The first connection failure is kept: every
    later request fails at once with the same message instead of waiting for a timeout each."""

    def __init__(self, spec: str, base: str, timeout: float, api_key: str | None) -> None:
        self.spec, self.base, self.timeout, self._api_key = spec, base, timeout, api_key
        self.down: EngineError | None = None

    def get(self, path: str) -> dict[str, Any]:
        return self._request(path, None)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request(path, body)

    def version(self) -> str | None:
        """The server's own version where it offers one (vLLM: ``GET /version``, beside ``/v1``)."""
        import urllib.request  # here, not at module level: pytest loads the plugin on every run

        root = self.base.removesuffix("/v1")
        try:
            with urllib.request.urlopen(f"{root}/version", timeout=self.timeout) as response:
                return str(json.loads(response.read()).get("version")) or None
        except (OSError, ValueError, AttributeError):
            return None

    def _request(self, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        __tracebackhide__ = True
        import urllib.error
        import urllib.request

        if self.down is not None:
            raise self.down.with_traceback(None)
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base}/{path}", data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:300]
            hint = " (an OpenAI-compatible API lives under /v1: does the URL end in /v1?)" if error.code == 404 else ""
            raise HTTPStatusError(self.spec, error.code, f"the server answered POST {self.base}/{path} with HTTP "
                                  f"{error.code}{hint}: {detail}") from None
        except (OSError, ValueError) as error:
            self.down = EngineError(self.spec, f"the server at {self.base} did not answer ({type(error).__name__}: "
                                    f"{error}). Is it running, at this URL? If it was, check its log; every later "
                                    "test that uses it fails with this message")
            raise self.down.with_traceback(None) from None
        if not isinstance(payload, dict):
            raise EngineError(self.spec, f"the server answered {path} with {type(payload).__name__}, not an object")
        return payload


class HTTPStatusError(EngineError):
    def __init__(self, spec: str, status: int, message: str) -> None:
        self.status = status
        super().__init__(spec, message)


class OpenAIEngine:
    name = "openai"
    hash_definition = "served-topk"
    runs_rows_alone = True  # one request at a time

    def __init__(self, spec: str, client: Client, model: str, tokenizer: Any, *, reset_prefix: bool = True,
                 eos: list[int] | None = None) -> None:
        self._spec, self._client, self._model, self._tokenizer = spec, client, model, tokenizer
        self._reset_prefix = reset_prefix
        self._eos = eos if eos is not None else ([] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)])
        self._send_ids: bool | None = None  # unknown until the first request
        self._zero: list[int] | None = None  # the first token of "0", once
        self._ids: dict[str, int] | None = None

    def _other_start(self, ids: list[int]) -> str:
        """A one-token prompt that shares no first token with ``ids`` (past a BOS both would have)."""
        first = next((t for t in ids if t != self._tokenizer.bos_token_id), None)
        if self._zero is None:
            self._zero = list(self._tokenizer("0", add_special_tokens=False)["input_ids"][:1])
        return "1" if self._zero == [first] else "0"

    def eos_token_ids(self) -> list[int]:
        return list(self._eos)

    def vocab_size(self) -> int:
        return len(self._tokenizer)

    def run(self, rows: list[list[int]], config: dict[str, Any], settings: GenerationSettings,
            keep_logits: bool) -> Chunk:
        __tracebackhide__ = True
        refuse_beyond("an OpenAI-compatible server", config, keep_logits=keep_logits, has_logits=False,
                      logprobs_after_penalties=False)
        out = Chunk(tokens=[], steps=[], texts=[], pieces=[], finish_reasons=[])
        for ids in rows:
            if self._reset_prefix:
                self._client.post("completions", {"model": self._model, "prompt": self._other_start(ids),
                                                  "max_tokens": 1, "temperature": 0.0})
            response = self._complete(ids, config, settings.seed)
            row = parse_choice(self._spec, response, len(ids), self.token_id, self._tokenizer)
            out.tokens.append(row.tokens)
            out.steps.append(row.steps)
            assert out.texts is not None and out.pieces is not None and out.finish_reasons is not None
            out.texts.append(row.text)
            out.pieces.append(row.pieces)
            out.finish_reasons.append(row.finish_reason)
            out.flags = {"system_fingerprint": response.get("system_fingerprint"), "temperature": 0,
                         "requests": "one at a time", "prompt_sent_as": "token ids" if self._send_ids else "text"}
        return out

    def _complete(self, ids: list[int], config: dict[str, Any], seed: int) -> dict[str, Any]:
        """The completion, the prompt sent as its token ids where the server takes them (the API allows
        it; vLLM does), else as text, which the server tokenises (llama-cpp-python)."""
        __tracebackhide__ = True
        if self._send_ids is not False:
            try:
                response = self._client.post("completions", request_body(self._model, ids, config, seed))
            except HTTPStatusError:
                if self._send_ids:
                    raise
                self._send_ids = False  # refused (llama-cpp-python answers 500 to a list): text it is
            else:
                self._send_ids = True
                return response
        return self._client.post("completions", request_body(self._model, self._tokenizer.decode(ids), config, seed))

    def token_id(self, text: str) -> int:
        """The local tokenizer's id for a returned token text: ``token_id:N`` as vLLM returns it (asked
        with ``return_tokens_as_token_ids``), else the one token that decodes to it (the lowest id if
        several do), else a stable id above the vocabulary (``TEXT_ONLY_IDS``)."""
        if text.startswith("token_id:") and text[9:].isdigit():
            return int(text[9:])
        if self._ids is None:
            pieces = self._tokenizer.batch_decode([[i] for i in range(len(self._tokenizer))])
            self._ids = {}
            for index, piece in enumerate(pieces):
                self._ids.setdefault(piece, index)
        return self._ids.get(text, text_only_id(text))


def text_only_id(text: str) -> int:
    import xxhash

    return TEXT_ONLY_IDS + xxhash.xxh32_intdigest(text.encode())


def request_body(model: str, prompt: str | list[int], config: dict[str, Any], seed: int) -> dict[str, Any]:
    """One greedy completion request: every sampler knob a known server reads, set to neutral."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": config["max_new_tokens"],
        "min_tokens": config["min_new_tokens"],  # vLLM and llama-cpp-python; others ignore it
        "temperature": 0.0,
        "top_p": 1.0,
        "n": 1,
        "stream": False,
        "echo": False,
        "logprobs": TOP_K,
        "seed": seed,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repeat_penalty": config["repetition_penalty"],  # llama-cpp-python (its default is 1.1)
        "repetition_penalty": config["repetition_penalty"],  # vLLM
        "cache_prompt": False,  # llama.cpp's server: evaluate the whole prompt, whatever came before
        "return_tokens_as_token_ids": True,  # vLLM: tokens as "token_id:N", exact where text is not
    }


class ParsedRow:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.steps = RowSteps()
        self.pieces: list[str] = []
        self.exact: list[bool] = []  # the server returned the id itself, not only text
        self.text = ""
        self.finish_reason = "length"


def parse_choice(spec: str, response: dict[str, Any], prompt_tokens: int, token_id: Any,
                 tokenizer: Any = None) -> ParsedRow:
    """One completion response as recorded steps, checked: the prompt's token count, greedy choice.
    With ``tokenizer``, steps that returned part of a character are given their ids (see
    :func:`resolve_partial_characters`)."""
    __tracebackhide__ = True
    import xxhash

    try:
        choice = response["choices"][0]
        logprobs = choice["logprobs"]
        texts, tops = logprobs["tokens"], logprobs["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise EngineError(spec, "the server's completion has no per-token logprobs (choices[0].logprobs.tokens "
                          "and top_logprobs); it must support the completions API's logprobs (llama-cpp-python: "
                          "logits_all, the default)") from None
    counted = (response.get("usage") or {}).get("prompt_tokens")
    if isinstance(counted, int) and counted != prompt_tokens:
        raise EngineError(spec, f"the server counts {counted} prompt tokens where the local tokenizer counts "
                          f"{prompt_tokens}: #tokenizer= is not the served model's tokenizer (or the server adds "
                          "a BOS of its own)")
    row = ParsedRow()
    for step, (text, top) in enumerate(zip(texts, tops)):
        ranked = sorted(((str(t), float(lp)) for t, lp in (top or {}).items()), key=lambda p: (-p[1], p[0]))[:TOP_K]
        if not ranked or text not in dict(ranked):
            ranked = ([(text, float(logprobs["token_logprobs"][step]))] + ranked)[:TOP_K]
        chosen = dict(ranked)[text]
        if chosen < ranked[0][1] - GREEDY_SLACK:
            raise EngineError(spec, f"the server did not decode greedily at step {step}: it chose {text!r} "
                              f"(logprob {chosen:.4f}) over {ranked[0][0]!r} ({ranked[0][1]:.4f}). A server-side "
                              "sampler or penalty is in force; check the server's defaults")
        step_hash = xxhash.xxh3_64_hexdigest(json.dumps([text, ranked], separators=(",", ":"),
                                                         ensure_ascii=False).encode())
        row.steps.append(step_hash, [token_id(t) for t, _ in ranked], [lp for _, lp in ranked])
        row.tokens.append(token_id(text))
        exact = text.startswith("token_id:")  # vLLM's exact ids: the piece is the tokenizer's text
        row.pieces.append(str(tokenizer.decode([row.tokens[-1]])) if exact and tokenizer is not None else text)
        row.exact.append(exact)
    row.text = str(choice.get("text", "".join(row.pieces)))
    row.finish_reason = "eos" if choice.get("finish_reason") == "stop" else "length"
    if tokenizer is not None:
        resolve_partial_characters(row, tokenizer)
    return row


def _partial(row: ParsedRow, step: int) -> bool:
    return not row.exact[step] and (row.pieces[step] == "" or "\ufffd" in row.pieces[step])


def resolve_partial_characters(row: ParsedRow, tokenizer: Any) -> None:
    """A token that holds part of a multi-byte character (CJK, emoji) comes back from a server as
    empty text or U+FFFD, so its id is unknown. A run of such steps spans the characters of the
    completion text between the known pieces around it; where the tokenizer encodes that span to
    exactly as many tokens, those are the ids (greedy output is the tokenizer's own encoding there).
    Otherwise the steps keep their text-only ids, and compare by what the server returned."""
    cursor, step = 0, 0
    steps = len(row.pieces)
    while step < steps:
        piece = row.pieces[step]
        if not _partial(row, step):
            if not row.text.startswith(piece, cursor):
                return  # the pieces do not tile the text: nothing can be placed safely
            cursor, step = cursor + len(piece), step + 1
            continue
        end = step
        while end < steps and _partial(row, end):
            end += 1
        following = row.pieces[end] if end < steps else ""
        stop = row.text.find(following, cursor) if following else len(row.text)
        if stop < cursor:
            return
        ids = list(tokenizer(row.text[cursor:stop], add_special_tokens=False)["input_ids"])
        if len(ids) == end - step:
            for index, resolved in zip(range(step, end), ids):
                unknown = row.tokens[index]
                row.tokens[index] = resolved
                row.steps.top[index] = tuple((resolved if t == unknown else t, lp) for t, lp in row.steps.top[index])
        cursor, step = stop, end
