"""The server engine (``openai:URL#...``) and what only a server needs: the HTTP client for a peer the
plugin does not trust (``server_client.py``), the completions API as pure data (``completions.py``),
scores through a server's echo (``server_score.py``), the API key that never shows (``secret.py``) and
a request run among concurrent companions (``companions.py``)."""
