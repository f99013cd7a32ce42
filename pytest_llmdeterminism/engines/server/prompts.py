"""How a server is sent a prompt: as its token ids where it takes them (the API allows it; vLLM
does), else as text, which the server tokenises (llama-cpp-python). One rule for the generation's
requests (``openai.py``) and the scores' (``server_score.py``), each learning it once per session."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_llmdeterminism.engines.server.completions import Completion, refuses_token_ids
from pytest_llmdeterminism.engines.server.server_client import Client, HTTPStatusError

__all__ = ["IdsOrText"]


class IdsOrText:
    """A sender of completion requests that learns, on its first, whether the server takes token ids:
    only an error answer to the first id prompt that says the server takes no such prompt
    (:func:`~completions.refuses_token_ids`) switches to text, for the session; any other is raised as
    it is (a transient status after its retries)."""

    _client: Client
    _tokenizer: Any
    _send_ids: bool | None = None  # unknown until the first request

    def _post_prompt(self, ids: list[int],
                     body_of: Callable[[list[int] | str], dict[str, Any]]) -> Completion:
        __tracebackhide__ = True
        if self._send_ids is not False:
            try:
                response = self._client.post("completions", body_of(ids), Completion)
            except HTTPStatusError as error:
                if self._send_ids or not refuses_token_ids(error.status, error.detail):
                    raise
                self._send_ids = False
            else:
                self._send_ids = True
                return response
        return self._client.post("completions", body_of(str(self._tokenizer.decode(ids))), Completion)

    @property
    def _sent_as(self) -> str:
        """What the flags of a chunk say of the prompts sent: ``token ids`` or ``text``."""
        return "token ids" if self._send_ids else "text"
