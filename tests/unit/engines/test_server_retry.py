"""When the client retries a transient answer (429, 502, 503, 504) and how long it waits: a pure
decision, so each rule has a plain unit test; the requests themselves are in ``test_hostile_server.py``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest

from pytest_llmdeterminism.engines.server.server_client import ATTEMPTS, BACKOFF, RETRY_AFTER_CAP, retry_wait


@pytest.mark.parametrize(("retry_after", "attempt", "wait"), [
    ("0", 1, 0.0), ("2", 1, 2.0), (" 7 ", 3, 7.0),  # seconds, as the server asks
    (None, 1, BACKOFF[0]), (None, 2, BACKOFF[1]), ("soon", 3, BACKOFF[2]),  # none, or none that parses
    (format_datetime(datetime(2000, 1, 1, tzinfo=timezone.utc), usegmt=True), 1, 0.0),  # a date past
])
def test_a_transient_answer_is_retried_after_the_wait_it_asks_for(retry_after, attempt, wait):
    assert retry_wait(retry_after, attempt, left=60.0) == (wait, "")


def test_an_http_date_is_waited_for_until_it_comes():
    soon = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=20), usegmt=True)
    wait, _ = retry_wait(soon, 1, left=60.0)
    assert wait is not None and 10 < wait <= 20


@pytest.mark.parametrize(("retry_after", "attempt", "left", "why"), [
    ("0", ATTEMPTS, 60.0, f"the same {ATTEMPTS} times in a row, with a wait before each retry"),
    (f"{RETRY_AFTER_CAP + 1:g}", 1, 600.0, "its Retry-After asks for 31 s, above the 30 s the plugin waits"),
    ("9" * 40, 1, 600.0, "its Retry-After asks for 1e+09 s, above the 30 s the plugin waits"),
    ("5", 1, 4.0, "a retry in 5 s would end past the request's deadline (#timeout=, retries included;"),
    (None, 1, 0.1, f"a retry in {BACKOFF[0]:g} s would end past the request's deadline"),
])
def test_no_retry_past_the_attempts_the_cap_or_the_deadline(retry_after, attempt, left, why):
    wait, reason = retry_wait(retry_after, attempt, left)
    assert wait is None and reason.startswith(why)
