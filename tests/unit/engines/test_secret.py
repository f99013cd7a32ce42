"""The API key as a :class:`Secret`: it never prints, and every form of it a server could echo back is
masked (and found: :meth:`Secret.holds`). Pure unit tests, one per encoding; the client's use of it
is in ``test_hostile_server.py``."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_llmdeterminism.engines.server.secret import RUN, Secret

KEY = "sk-hostile-0123456789abcdef"
B64 = base64.b64encode
URLSAFE = base64.urlsafe_b64encode


def _b64(raw: bytes, *, urlsafe: bool = False, padded: bool = True) -> str:
    text = (URLSAFE if urlsafe else B64)(raw).decode()
    return text if padded else text.rstrip("=")


ECHOES = {
    "verbatim": KEY,
    "upper-cased": KEY.upper(),
    "mixed case": "".join(c.upper() if i % 2 else c for i, c in enumerate(KEY)),
    "JSON-escaped": json.dumps(KEY)[1:-1],
    "URL-encoded": quote(KEY, safe=""),
    "URL-encoded, every byte": "".join(f"%{b:02X}" for b in KEY.encode()),
    "hex": KEY.encode().hex(),
    "HEX": KEY.encode().hex().upper(),
    "hex with colons": ":".join(f"{b:02x}" for b in KEY.encode()),
    "base64": _b64(KEY.encode()),
    "base64 unpadded": _b64(KEY.encode(), padded=False),
    "base64 URL-safe": _b64(KEY.encode(), urlsafe=True),
    "base64 of Bearer KEY": _b64(f"Bearer {KEY}".encode()),
    "base64 of user:KEY": _b64(f"user:{KEY}".encode()),
    "base64 URL-safe unpadded of :KEY": _b64(f":{KEY}".encode(), urlsafe=True, padded=False),
    "base64 wrapped at 16": "\n".join(_b64(KEY.encode())[i:i + 16] for i in range(0, 36, 16)),
    "halves on two lines": f"{KEY[:13]}\n{KEY[13:]}",
    "halves as JSON strings": json.dumps([KEY[:13], KEY[13:]]),
    "a space every 4": " ".join(KEY[i:i + 4] for i in range(0, len(KEY), 4)),
    "dots between": ".".join(KEY),
    "reversed halves": f"{KEY[13:]} ... {KEY[:13]}",
    "the first 12": KEY[:12],
    "the last 12": KEY[-12:],
}


@pytest.mark.parametrize("encoding", list(ECHOES))
def test_a_key_echoed_in_any_encoding_is_masked(encoding):
    echoed = ECHOES[encoding]
    masked = Secret(KEY).mask(f"invalid key {echoed!s} (request 42)")
    assert masked.startswith("invalid key ") and masked.endswith(" (request 42)") and "***" in masked
    alphanumeric = "".join(c for c in masked.lower() if c.isalnum())
    assert echoed not in masked and KEY.lower() not in alphanumeric
    for piece in ("hostile", "56789abc", "0123456"):
        assert piece not in masked.lower()


def test_the_bytes_around_a_masked_key_are_kept():
    masked = Secret(KEY).mask(f'{{"error": "bad header Bearer {KEY}", "id": "req-77"}}')
    assert masked == '{"error": "bad header Bearer ***", "id": "req-77"}'
    assert Secret(KEY).mask(f"http://h/v1?echo={KEY}&x=1") == "http://h/v1?echo=***&x=1"


@pytest.mark.parametrize("text", [
    "the server is overloaded; retry in 3 s",
    "model 'gpt-4o-mini' not found (request id 0a1b2c3d4e5f6a7b, fingerprint fp_44709d6fcb)",
    "sk-other-key-zzzzzzzzzzzz and 0123456 are not it",
    "",
])
def test_text_without_the_key_is_unchanged(text):
    assert Secret(KEY).mask(text) == text


def test_a_key_shorter_than_a_run_is_masked_only_as_it_is():
    text = f"EMPTY: the prompt is empty ({b'EMPTY'.hex()}, {base64.b64encode(b'EMPTY').decode()})"
    assert Secret("EMPTY").mask(text) == text.replace("EMPTY", "***", 1)


def test_a_secret_prints_as_three_stars_and_its_header_bytes_too():
    secret = Secret(KEY)
    shown = [repr(secret), str(secret), f"{secret}", repr({"Authorization": secret}), repr([secret])]
    assert shown == ["***", "***", "***", "{'Authorization': ***}", "[***]"]
    header = secret.authorization()
    assert header == f"Bearer {KEY}".encode() and repr(header) == "b'***'" and str(header) == "b'***'"
    assert KEY not in repr([header]) and not Secret("") and secret


@pytest.mark.parametrize(("key", "says"), [("sk-ok-123", None), ("sk with space", "holds a space"),
                                           ("sk-\n", "a line break"), ("sk-é", "a non-ASCII character")])
def test_a_key_no_header_can_carry_is_named(key, says):
    problem = Secret(key).problem()
    assert problem is None if says is None else says in problem


KEYS = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"),
               min_size=20, max_size=64).filter(lambda k: sum(c.isalnum() for c in k) >= 16)
SEPARATORS = st.text(st.sampled_from(" \n\t,.;:\"'-_/|"), min_size=0, max_size=3)


@given(KEYS, st.lists(SEPARATORS, min_size=64, max_size=64), st.text(max_size=20), st.booleans())
def test_a_key_split_anywhere_by_anything_but_letters_and_digits_is_masked(key, separators, around, upper):
    split = "".join(c + separator for c, separator in zip(key, separators, strict=False))
    split = split.upper() if upper else split
    masked = Secret(key).mask(f"{around}{split}{around}")
    alphanumeric = "".join(c for c in masked.lower() if c.isascii() and c.isalnum())
    letters = "".join(c for c in key.lower() if c.isalnum())
    assert not any(letters[i:i + RUN] in alphanumeric for i in range(len(letters) - RUN + 1))


TEXT = f"The answer is {KEY}, cat"


@given(st.lists(st.integers(0, len(TEXT)), max_size=30))
def test_a_key_split_over_tokens_anywhere_is_held_by_their_joined_text(cuts):
    bounds = sorted({0, len(TEXT), *cuts})
    pieces = [TEXT[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert Secret(KEY).holds("".join(pieces))


def test_text_without_the_key_is_not_held_and_any_encoding_of_it_is():
    assert not Secret(KEY).holds("The cat sat on the mat 0123456") and not Secret("").holds("anything")
    hexed = f"Bearer {KEY}".encode().hex()
    assert Secret(KEY).holds("hex: " + " ".join(hexed[i:i + 5] for i in range(0, len(hexed), 5)))
