"""LLM client errors.

LLMError                  carries provider, status, body and lower-cased headers
 +-- TransientError       worth retrying with backoff
 |    +-- RateLimited     429 (retry_after seconds when the server said so)
 |    +-- ServerError     5xx, overloaded
 |    |    +-- Loading    503 "Loading model": a local server (llama.cpp, Ollama) is up and
 |    |                   still loading its model; waited for (`bot.llm.retry`)
 |    +-- StreamError     timeout, connection dropped, stream cut before its end
 |         +-- Unreachable no connection could be made (DNS, refused, connect timeout):
 |                         retried briefly, since a down network is not back in seconds
 +-- ContextOverflow      the request does not fit the model's context window
 +-- AuthError            401/403: the message names the env var to check
 +-- RequestError         any other 4xx: the request itself is wrong
      +-- Rejected        a 400 or 500 whose body names what in the request the server
                          could not take (roles out of the order its template demands, a
                          tool call it cannot parse, an image it cannot read): not an
                          outage, so not retried as one; `cause` says which, and the
                          OpenAI-compatible client repairs what it sends (`bot.llm.repair`)
"""


class LLMError(Exception):
    def __init__(self, message: str, *, provider: str = "", status: int | None = None,
                 body: str = "", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.provider = provider
        self.status = status
        self.body = body
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}


class TransientError(LLMError):
    pass


class RateLimited(TransientError):
    def __init__(self, message: str, *, retry_after: float | None = None, **kw):
        super().__init__(message, **kw)
        self.retry_after = retry_after


class ServerError(TransientError):
    pass


class StreamError(TransientError):
    pass


class Unreachable(StreamError):
    """The provider's host could not be reached at all; nothing was sent."""


class Loading(ServerError):
    """The server answered that it is still loading its model (a local server after a
    restart takes 10-60 s): worth waiting for, like one restarting."""


class ContextOverflow(LLMError):
    pass


class AuthError(LLMError):
    def __init__(self, message: str, *, key_env: str | None = None, **kw):
        super().__init__(message, **kw)
        self.key_env = key_env  # the environment variable the key was read from


class RequestError(LLMError):
    pass


class Rejected(RequestError):
    """The server could not take this request, and said what in it (see the module doc).
    `cause`: "roles", "tool_call" or "image"."""

    def __init__(self, message: str, *, cause: str, **kw):
        super().__init__(message, **kw)
        self.cause = cause
