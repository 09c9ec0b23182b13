"""LLM client errors.

LLMError                  carries provider, status, body and lower-cased headers
 +-- TransientError       worth retrying with backoff
 |    +-- RateLimited     429 (retry_after seconds when the server said so)
 |    +-- ServerError     5xx, overloaded
 |    +-- StreamError     timeout, connection refused or dropped, stream cut before its end
 +-- ContextOverflow      the request does not fit the model's context window
 +-- AuthError            401/403: the message names the env var to check
 +-- RequestError         any other 4xx: the request itself is wrong
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


class ContextOverflow(LLMError):
    pass


class AuthError(LLMError):
    pass


class RequestError(LLMError):
    pass
