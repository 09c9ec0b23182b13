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
"""

from __future__ import annotations

import aiohttp
from slack_sdk.errors import SlackApiError

from bot.port import NotPerformed, Unavailable

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


def not_done(exc: BaseException) -> bool:
    """The failed call certainly changed nothing in Slack."""
    if isinstance(exc, SlackApiError):
        status, error = _api_error(exc)
        # An ok=false answer that is not an outage was refused by Slack: nothing done.
        return status == 429 or error in NOT_DONE_ERRORS or not is_outage(exc)
    return isinstance(exc, UNSENT)


def describe(exc: BaseException) -> str:
    if isinstance(exc, SlackApiError):
        status, error = _api_error(exc)
        return f"Slack answered {status} {error or '(no error code)'}"
    return f"{type(exc).__name__}: {exc}"


def for_runtime(exc: BaseException, *, maybe_shown: bool) -> Exception:
    """The runtime's exception for an outage during a delivery: `NotPerformed` if nothing
    this try did can have changed what Slack shows, else `Unavailable`."""
    if maybe_shown:
        return Unavailable(f"Slack unavailable, the answer may be partly shown: "
                           f"{describe(exc)}")
    return NotPerformed(f"Slack unavailable, nothing was shown: {describe(exc)}")
