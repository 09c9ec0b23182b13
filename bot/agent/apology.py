"""What the person is told when the model gave no answer: short and generic. The
provider's own error text never reaches a channel (it can echo a request, or a masked key's
tail, into a shared channel); it goes to the log, with anything that looks like a secret
taken out."""

import logging

from bot.redact import redact
from bot.runtime.errors import POISON

log = logging.getLogger(__name__)

_BY_TYPE = {
    "RateLimited": "the model provider is limiting how often I may ask",
    "ServerError": "the model provider is having trouble right now",
    "StreamError": "the model provider could not be reached",
    "Unreachable": "the model provider could not be reached",
    "AuthError": "the model provider refused my credentials (check the API key",
    "RequestError": "the model provider refused the request",
    "Rejected": "the model server could not take what I sent, even after I changed what "
                "it named (the log says what)",
    "Loading": "the model server was still loading its model when I gave up waiting",
    "ContextOverflow": "the conversation no longer fits the model's context window",
}


def apology(result: dict, error: str | None, state: str, *, failure: str | None = None
            ) -> str:
    """The answer for an LLM call that ended without a reply (`result` of the llm_call
    task, or its `error`, `state` and `failure` kind when it failed outright)."""
    detail = result.get("error") or error or state
    log.warning("the model gave no answer (%s): %s", result.get("error_type") or state,
                redact(str(detail)))
    if failure == POISON:
        reason = "asking the model made Steward crash each time it tried"
    else:
        reason = _BY_TYPE.get(result.get("error_type") or "",
                              "something went wrong on my side (the log says what)")
    if result.get("error_type") == "AuthError":  # a variable's name is no secret
        key_env = result.get("key_env")
        reason += f" in the environment variable {key_env})" if key_env else ")"
    text = f"Sorry, I could not get an answer from the model: {reason}."
    if result.get("retry_after"):  # a rate limit longer than retries wait out
        minutes = max(1, round(result["retry_after"] / 60))
        text += f" The provider asks me to wait about {minutes} minute" \
                f"{'s' if minutes > 1 else ''}; please ask again then."
    return text
