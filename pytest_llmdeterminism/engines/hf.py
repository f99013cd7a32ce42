"""transformers backend: local folders (safetensors only) and GGUF files, offline, no remote code."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compute.determinism import deterministic_state
from pytest_llmdeterminism.compute.kernels import Kernels
from pytest_llmdeterminism.decoding import DecodingConfig, Speculation
from pytest_llmdeterminism.engines import hf_phases, hf_speculative
from pytest_llmdeterminism.engines.cached import converted_copy, keep_converted
from pytest_llmdeterminism.engines.capture import (
    Chunk,
    ScoreChunk,
    StepCapture,
    prompt_positions,
    score_positions,
)
from pytest_llmdeterminism.engines.checkpoint import (
    clean_generation_config,
    ensure_pad_token,
    pretrained_arguments,
    silence_gguf_progress_bar,
)
from pytest_llmdeterminism.engines.fingerprints import transformers_fingerprint
from pytest_llmdeterminism.errors import ConfigurationError, ModelLoadError, pasteable
from pytest_llmdeterminism.generation import HashDefinition
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from pytest_llmdeterminism.engines.loaded import LoadedModel

_PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def worker_cuda_index(worker_id: str | None, device_count: int) -> int:
    """The visible CUDA device for a pytest-xdist worker: ``gwK`` takes ``K mod device_count``.

    Indices count visible devices, so ``CUDA_VISIBLE_DEVICES`` is honoured; outside xdist it is 0.
    """
    match = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(match[1]) % device_count if match and device_count > 0 else 0


class HFEngine:
    """transformers in the test process: one ``model.generate`` call per chunk, at ``B x L``, left
    padded, filler rows repeating the first prompt; logits hashed in a forward hook."""

    name = "transformers"
    hash_definition = HashDefinition.LOGITS
    runs_rows_alone = False  # rows share a batch: batch invariance must be verified
    owns_sampling = True  # do_sample=True: the plugin's sampler draws in a logits processor
    supports_audit = True

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, device: str, *,
                 kernels: Kernels | None = None) -> None:
        self.model, self.tokenizer, self.device = model, tokenizer, device
        # the kernels chosen at load (compute/kernels.py): each generation runs inside kernels.routed
        self.kernels = kernels or Kernels()

    def in_dtype(self, dtype: str) -> HFEngine:
        """This engine on a copy of the weights cast to ``dtype`` (the audit's dtype row), on the same
        kernels."""
        import copy

        import torch

        model = copy.deepcopy(self.model).to(getattr(torch, dtype))
        return HFEngine(model, self.tokenizer, self.device, kernels=self.kernels)

    def eos_token_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return [eos] if isinstance(eos, int) else list(eos or [])

    def vocab_size(self) -> int:
        return min(len(self.tokenizer), getattr(self.model.config, "vocab_size", None) or len(self.tokenizer))

    def fingerprint(self, loaded: LoadedModel) -> dict[str, Any]:
        """Read from torch and the model, with the generation of the batch-invariant kernels chosen at
        load (only goldens computed on them carry it)."""
        return transformers_fingerprint(loaded, kernels_generation=self.kernels.generation)

    def run(self, rows: list[list[int]], config: DecodingConfig, settings: GenerationSettings,
            keep_logits: bool) -> Chunk:
        import torch
        from transformers import GenerationConfig

        from pytest_llmdeterminism.compute.determinism import flags

        shape = settings.batch_shape.running(max(map(len, rows)))
        self._refuse_past_context(shape, config.max_new_tokens, settings)
        model = self.model
        if model.training:
            model.eval()  # dropout at inference is random; a test may have called .train()
        if config.speculation is not None:  # each row alone: transformers speculates at batch size 1
            return hf_speculative.speculate(model, self.kernels, self.device, rows, config,
                                            _transformers_arguments(config), settings.seed, keep_logits)
        input_ids, attention_mask = self._left_padded(rows, shape)
        with clean_generation_config(model), deterministic_state(settings.seed), torch.inference_mode(), \
                StepCapture(model, rows=len(rows), keep_logits=keep_logits,
                            processed=_has_processors(config) or config.sampling is not None) as capture, \
                self.kernels.routed(model):
            processors = capture.logits_processor()
            if config.sampling is not None:  # last: the draw sees the scores the capture recorded
                processors.append(draw := _draw_class()(rows, config))
            output = model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=GenerationConfig(**_transformers_arguments(config)),
                logits_processor=processors,
            )
            in_force = flags()  # as they were for this call
        tokens = output[: len(rows), shape.length:].cpu().tolist()
        logits = [[step[row] for step in capture.logits] for row in range(len(rows))] if keep_logits else []
        return Chunk(tokens=tokens, steps=capture.rows, flags=in_force, logits=logits,
                     draw_margins=draw.margins if config.sampling is not None else [])

    def score(self, rows: list[tuple[list[int], list[int]]], settings: GenerationSettings, *,
              top_k: int, prompt_logprobs: bool) -> ScoreChunk:
        """One forward over each prompt + continuation at ``B x L`` (left padded, filler rows repeating
        the first pair, positions counted from each row's first token as ``generate`` counts them), on
        the kernels generation runs on, with every position's logits, so that a row's bits do not
        depend on its companions. The continuation's last token predicts nothing and is left out: a
        one-token continuation's forward is a generation's first (prefill) forward, bit for bit."""
        import torch

        from pytest_llmdeterminism.compute.determinism import flags

        run = [prompt + continuation[:-1] for prompt, continuation in rows]
        shape = settings.batch_shape.running(max(map(len, run)))
        context = getattr(self.model.config, "max_position_embeddings", None)
        if isinstance(context, int) and shape.length > context:
            fix = ("shorten the prompt or the continuation" if shape.rows == 1 else
                   f"use a shorter L in {settings.batch_shape_setting.replace('=...', '')}")
            raise ConfigurationError("llm_model.score(continuation)", f"{max(map(len, run)) + 1} tokens",
                                     f"the {shape} shape's {shape.length} positions are beyond the model's "
                                     f"context of {context} (max_position_embeddings in its config); {fix}")
        input_ids, attention_mask = self._left_padded(run, shape)
        # As generate() counts a left-padded row's positions: from its first real token.
        position_ids = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
        model = self.model
        if model.training:
            model.eval()  # dropout at inference is random; a test may have called .train()
        scored = []
        with deterministic_state(settings.seed), torch.inference_mode(), self.kernels.routed(model):
            output = model(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device),
                           position_ids=position_ids.to(self.device), use_cache=False)
            in_force = flags()  # as they were for this call
            logits = output.logits[: len(rows)].to(torch.float32).cpu()
            for row, (prompt, continuation) in enumerate(rows):
                first = shape.length - len(run[row])  # the row's first token
                predicting = logits[row, first + len(prompt) - 1:]  # each predicts a continuation token
                found = score_positions(predicting, torch.log_softmax(predicting, dim=-1), continuation,
                                        top_k)
                if prompt_logprobs:
                    before = torch.log_softmax(logits[row, first:first + len(prompt) - 1], dim=-1)
                    found.prompt_logprobs = prompt_positions(before, prompt)
                scored.append(found)
        return ScoreChunk(rows=scored, flags=in_force)

    def speculation(self, asked: Speculation) -> Speculation:
        """``hf_speculative.checked`` on this engine's model and kernels."""
        return hf_speculative.checked(self.kernels, self.model, asked)

    def phase_logits(self, ids: list[int], pieces: list[int], seed: int, *,
                     reuse_from: list[int] | None = None) -> torch.Tensor:
        """``hf_phases.phase_logits`` on this engine's model and kernels."""
        return hf_phases.phase_logits(self.model, self.kernels, self.device, ids, pieces, seed,
                                      reuse_from=reuse_from)

    def _left_padded(self, rows: list[list[int]], shape: BatchShape) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunk's ``input_ids`` and ``attention_mask`` in the fixed shape, each row left-padded.
        Filler rows repeat the chunk's first row: a real sequence, so no row is all padding."""
        import torch

        input_ids = torch.full((shape.rows, shape.length), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((shape.rows, shape.length), dtype=torch.long)
        for row in range(shape.rows):
            ids = rows[row] if row < len(rows) else rows[0]
            input_ids[row, shape.length - len(ids):] = torch.tensor(ids)
            attention_mask[row, shape.length - len(ids):] = 1
        return input_ids, attention_mask

    def _refuse_past_context(self, shape: BatchShape, max_new_tokens: int,
                             settings: GenerationSettings) -> None:
        """Positions past the model's context give no meaningful logits (and may run for minutes): the
        padded prompt plus every new token must fit ``max_position_embeddings``."""
        __tracebackhide__ = True
        length = shape.length
        context = getattr(self.model.config, "max_position_embeddings", None)
        if not isinstance(context, int) or length + max_new_tokens <= context:
            return
        fits = context - length
        fix = (f"lower max_new_tokens to at most {fits} (@deterministic(max_new_tokens=...), "
               f"llm_max_new_tokens or generate(max_new_tokens=...))" if fits >= 1 else
               "shorten the prompt" if shape.rows == 1 else
               f"use a shorter L in {settings.batch_shape_setting.replace('=...', '')}")
        raise ConfigurationError("max_new_tokens", max_new_tokens,
                                 f"the {shape} shape's {length} prompt positions plus {max_new_tokens} "
                                 f"new tokens need {length + max_new_tokens} positions, beyond the model's "
                                 f"context of {context} (max_position_embeddings in its config); {fix}")


def _transformers_arguments(config: DecodingConfig) -> dict[str, Any]:
    """``config`` as ``GenerationConfig`` keywords. ``min_new_tokens=0`` is left out: transformers would
    turn it into ``min_length`` = the prompt's length and run a ``MinLengthLogitsProcessor`` at every
    step that never changes a score (the prompt is always that long): ~20 us a step, with its signature."""
    arguments = config.as_dict()
    if not arguments["min_new_tokens"]:
        del arguments["min_new_tokens"]
    # The plugin's sampler draws (a logits processor): transformers decodes greedily over its scores.
    for name in ("sampler", "temperature", "top_k", "top_p", "min_p", "seed"):
        arguments.pop(name, None)
    arguments["do_sample"] = False
    return arguments


@functools.cache
def _draw_class() -> type:
    """The logits processor that draws each real row's token with the plugin's sampler
    (``sampling.py``) and leaves greedy decoding nothing else to pick; filler rows stay greedy. Made
    once: transformers is imported only when a model runs."""
    import inspect

    import torch
    from transformers import LogitsProcessor

    from pytest_llmdeterminism import sampling
    from pytest_llmdeterminism.generation import LOGPROB_DECIMALS, LOGPROB_FLOOR

    class _Draw(LogitsProcessor):  # type: ignore[misc]
        def __init__(self, rows: list[list[int]], config: DecodingConfig) -> None:
            assert config.sampling is not None
            self._configs = [dataclasses.replace(config.sampling, seed=config.seed_of(row))
                             for row in range(len(rows))]
            self._keys = [each.noise_key(ids) for each, ids in zip(self._configs, rows, strict=True)]
            self._step = 0
            self.margins: list[list[float]] = [[] for _ in rows]

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            rows = len(self._keys)
            draws = sampling.draw_batch(scores[:rows].float().cpu().numpy(), self._configs, keys=self._keys,
                                        step=self._step)
            self._step += 1
            chosen = scores.clone()
            for row, drawn in enumerate(draws):
                chosen[row] = -torch.inf
                chosen[row, drawn.token_id] = 0.0
                self.margins[row].append(round(min(drawn.margin, -LOGPROB_FLOOR), LOGPROB_DECIMALS))
            return chosen

    _Draw.__call__.__signature__ = inspect.signature(_Draw.__call__)  # type: ignore[attr-defined]
    return _Draw


def _has_processors(config: DecodingConfig) -> bool:
    """Whether transformers runs a logits processor for ``config`` (greedy, on a clean
    ``GenerationConfig``): only these settings add one, so otherwise its scores are the raw logits."""
    return bool(config.min_new_tokens or config.repetition_penalty != 1.0 or config.no_repeat_ngram_size)


def pick_device(spec: str, device: str) -> str:
    import torch

    if device == "auto" and not torch.cuda.is_available():
        return "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ModelLoadError(spec, f"llm_device = {device!r} but CUDA is not available here (torch "
                             f"{torch.__version__}, {built}). Use {pasteable('llm_device', 'auto')} or cpu, "
                             "or install a CUDA build of torch")
    if device in ("auto", "cuda"):  # one GPU per xdist worker; an explicit cuda:N is kept
        return f"cuda:{worker_cuda_index(os.environ.get('PYTEST_XDIST_WORKER'), torch.cuda.device_count())}"
    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.partition(":")[2] or 0)
        if index >= count:
            raise ModelLoadError(spec, f"llm_device = {device!r} but this machine has {count} CUDA "
                                 f"device(s) visible. Use {pasteable('llm_device', 'auto')} or cpu, or check "
                                 "CUDA_VISIBLE_DEVICES")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(spec, "llm_device = 'mps' but MPS is not available here; use "
                             f"{pasteable('llm_device', 'auto')} or cpu")
    return device


def load(spec: str, kind: str, path: Path, *, dtype: str,
         device: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """The model on ``device`` (as :func:`pick_device` chose it), its tokenizer, and where a ``.gguf``
    file's float32 weights came from ("" otherwise): its converted copy, or the file, converted now for
    later loads (``cached.py``)."""
    __tracebackhide__ = True
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    source, common = pretrained_arguments(spec, path)
    copy = converted_copy(path) if kind == "gguf" and dtype == "float32" else None
    converted = copy.folder if copy is not None else None
    from_gguf = kind == "gguf"
    if copy is not None and copy.usable:
        source, from_gguf = str(converted), False
        common = {"local_files_only": True, "trust_remote_code": False}
    if kind != "gguf":
        pickles = sorted(p.name for pattern in _PICKLE_WEIGHTS for p in path.glob(pattern))
        if pickles and not any(path.glob("model*.safetensors")):
            raise ModelLoadError(
                spec, f"{str(path)!r} holds pickle weights ({', '.join(pickles[:4])}), which can run code "
                "when loaded and are refused. Convert them to safetensors once, in a trusted environment "
                "(model.save_pretrained(dir, safe_serialization=True)).",
            )
        if not any(path.glob("*.safetensors")):
            found = sorted(p.name for p in path.iterdir())[:8]
            raise ModelLoadError(
                spec, f"no *.safetensors weights in {str(path)!r} (found: {', '.join(found) or 'nothing'}). "
                "Pickle checkpoints (pytorch_model.bin) are refused; convert them to safetensors "
                "(model.save_pretrained(dir, safe_serialization=True)).",
            )
    progress_bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one model load per session; its progress bar is noise in test output
    gguf_bar = silence_gguf_progress_bar() if from_gguf else None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **common)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=getattr(torch, dtype), use_safetensors=not from_gguf, **common
        )
    except (OSError, ValueError) as error:
        raise ModelLoadError(spec, f"{type(error).__name__}: {error}") from error
    else:
        origin = ""
        if converted is not None and not from_gguf:
            origin = f"from its float32 copy in {converted}"
        elif converted is not None and keep_converted(model, tokenizer, converted):  # progress bars still off
            origin = f"converted to float32 once, into {converted}, for later loads"
        if copy is not None and copy.discarded:
            kept = "converted again, for later loads" if origin else "converted again, not kept"
            origin = f"its float32 copy in {converted} failed its digest check: {copy.discarded}; {kept}"
    finally:
        if progress_bars:
            hf_logging.enable_progress_bar()
        if gguf_bar is not None:
            gguf_bar()
    model.to(device)
    model.eval()
    ensure_pad_token(tokenizer)
    return model, tokenizer, origin


def float32_folder(spec: str, gguf: Path, *, scratch: Path) -> Path:
    """A transformers folder with ``gguf``'s float32 weights, configuration and tokenizer, for commands
    that read the files rather than the loaded model (``llm-golden perturb``, ``fetch --hub-cache``):
    its converted copy (digest-checked), made now by :func:`load` when there is none. Where the cache
    cannot keep one (read-only, full), the conversion is written into ``scratch`` instead."""
    __tracebackhide__ = True
    copy = converted_copy(gguf)
    if copy.usable:
        return copy.folder
    try:
        model, tokenizer, _ = load(spec, "gguf", gguf, dtype="float32", device="cpu")
    except ModelLoadError:
        raise
    except Exception as error:  # noqa: BLE001 - a file the GGUF reader fails on (struct.error), as a load
        raise ModelLoadError(spec, f"{type(error).__name__}: {error}") from error
    copy = converted_copy(gguf)
    if copy.usable:
        return copy.folder
    own = scratch / "converted"
    if not keep_converted(model, tokenizer, own):
        raise OSError(f"could not write the float32 conversion of {str(gguf)!r} into {str(scratch)!r}, "
                      f"nor into {str(copy.folder.parent)!r}")
    return own
