"""What a failed Slack call means for a delivery: an outage or an ordinary error, and
whether the call may have taken effect.

    outage        Slack cannot be reached or is in trouble: a connection error or timeout,
                  an HTTP 5xx or 429, or internal_error / fatal_error / service_unavailable /
                  ratelimited / request_timeout in the body. The runtime rides it out
                  (`outage_attempts`) instead of dead-lettering after `max_attempts`.
    not_done      the call certainly had no effect: the connection was never made (refused,
                  DNS, TLS, connect timeout: nothing was sent), Slack rate limited it (429:
                  rejected before processing), or Slack says the POST arrived incomplete
                  (request_timeout). Slack's own words for internal_error and fatal_error are
                  "it's possible some aspect of the operation succeeded": in doubt, like a
                  connection dropped after the request went out.

Anything else (channel_not_found, invalid_auth, msg_too_long...) is an ordinary error.

Taking an event in talks to two outside worlds, Slack and the store, and a lost
connection can be either's. `outage_of` tells them apart: an error raised by a Slack call
(`SlackWeb` marks each one, `from_slack`) is Slack's; otherwise the store's outage
(`store_unavailable`: its connection lost, its server restarting, its disk full) is asked
first, so that a PostgreSQL connection error is never reported as Slack being away.
"""

from __future__ import annotations

import aiohttp
from slack_sdk.errors import SlackApiError

from bot.port import NotPerformed, Unavailable, store_unavailable

NOT_DONE_ERRORS = {"ratelimited", "rate_limited", "request_timeout"}
DOUBT_ERRORS = {"internal_error", "fatal_error", "service_unavailable"}
# Raised before a byte of the request was sent.
UNSENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
# The connection failed or timed out somewhere after it was made.
DOUBTFUL = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError,
            ConnectionError)


def _api_error(exc: SlackApiError) -> tuple[int, str]:
    response = exc.response
    status = getattr(response, "status_code", 0) or 0
    try:
        error = str(response.get("error") or "")
    except Exception:  # noqa: BLE001 - a body that is not Slack's JSON
        error = ""
    return status, error


def is_outage(exc: BaseException) -> bool:
    if isinstance(exc, SlackApiError):
        status, error = _api_error(exc)
        return status == 429 or status >= 500 or error in NOT_DONE_ERRORS | DOUBT_ERRORS
    return isinstance(exc, UNSENT + DOUBTFUL)


SLACK_CALL = "_steward_slack_call"  # the attribute `SlackWeb` marks its calls' errors with
_DEPTH = 8


def mark_from_slack(exc: BaseException, method: str) -> None:
    """Note on `exc` that a Slack call (`method`) raised it."""
    try:
        setattr(exc, SLACK_CALL, method)
    except Exception:  # noqa: BLE001 - an exception that takes no attributes: types tell
        pass


def from_slack(exc: BaseException) -> bool:
    """Raised by a Slack call: marked so, or one of the Slack client's own errors (also
    when it is the `__cause__` of what was raised)."""
    cause: BaseException | None = exc
    for _ in range(_DEPTH):
        if cause is None:
            return False
        if getattr(cause, SLACK_CALL, None) or isinstance(cause, SlackApiError
                                                          | aiohttp.ClientError):
            return True
        cause = cause.__cause__
    return False


def outage_of(exc: BaseException) -> str | None:
    """Whose outage made an event's processing fail: "store", "slack", or None when it is
    no outage (then it may be the event's fault)."""
    if not from_slack(exc) and store_unavailable(exc):
        return "store"
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen and len(seen) < _DEPTH:
        seen.add(id(cause))
        if is_outage(cause):
            return "slack"
        cause = cause.__cause__ or cause.__context__
    return None


def not_done(exc: BaseException) -> bool:
    """The failed call certainly changed nothing in Slack."""
    if isinstance(exc, SlackApiError):
        status, error = _api_error(exc)
        # An ok=false answer that is not an outage was refused by Slack: nothing done.
        return status == 429 or error in NOT_DONE_ERRORS or not is_outage(exc)
    return isinstance(exc, UNSENT)


def describe(exc: BaseException) -> str:
    """One short line: Slack's answer, or the error's type and the first line of its text
    (a database error's text goes on with its SQL and parameters)."""
    if isinstance(exc, SlackApiError):
        status, error = _api_error(exc)
        return f"Slack answered {status} {error or '(no error code)'}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:300]}"


def for_runtime(exc: BaseException, *, maybe_shown: bool) -> Exception:
    """The runtime's exception for an outage during a delivery: `NotPerformed` if nothing
    this try did can have changed what Slack shows, else `Unavailable`."""
    if maybe_shown:
        return Unavailable(f"Slack unavailable, the answer may be partly shown: "
                           f"{describe(exc)}")
    return NotPerformed(f"Slack unavailable, nothing was shown: {describe(exc)}")
