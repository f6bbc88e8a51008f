"""The remote engine's errors: ``RemoteError`` (an ``EngineCrashed``) and its kinds, ``RemoteRateLimited`` (a
``QueueFull``) and ``RemoteBadRequest`` (an ``InvalidRequest``); which exchange raises which is in docs/remote.md."""

from __future__ import annotations

from typing import Optional

from app.errors import EngineCrashed, InvalidRequest, QueueFull


class RemoteError(EngineCrashed):
    """The remote engine failed. ``remote``: ``"name (url)"``; ``status``: the HTTP status when one came;
    ``partial_text`` / ``partial_reasoning``: what it had said before it failed (already streamed to the
    caller as ``Delta`` events). A subclass of ``EngineCrashed``: like a dead engine process, the next request
    tries again (the port answers 503 with Retry-After)."""

    def __init__(self, message: str, remote: str = "", status: Optional[int] = None, partial_text: str = "",
                 partial_reasoning: str = "") -> None:
        super().__init__(message)
        self.remote, self.status = remote, status
        self.partial_text, self.partial_reasoning = partial_text, partial_reasoning

    def __reduce__(self):
        return (self.__class__, (self.message, self.remote, self.status, self.partial_text,
                                 self.partial_reasoning))


class RemoteUnreachable(RemoteError):
    """No connection: refused, no such host, or no answer within the connect timeout."""


class RemoteTimeout(RemoteError):
    """The remote sent nothing for ``read_timeout_s`` seconds (before the answer or in the middle of it)."""


class RemoteAuthError(RemoteError):
    """401 / 403: the remote refused the API key (or wants one and none is set)."""


class RemoteServerError(RemoteError):
    """A 5xx answer, or an error event inside the stream; the message is the remote's."""


class RemoteStreamError(RemoteError):
    """The stream broke: a malformed line, the connection lost mid-answer, or no ``[DONE]`` at its end."""


class RemoteRateLimited(QueueFull):
    """429 from the remote; ``retry_after_s`` from its Retry-After header (1 s when it sent none)."""

    def __init__(self, message: str, retry_after_s: float = 1.0, remote: str = "") -> None:
        super().__init__(message, retry_after_s)
        self.remote = remote

    def __reduce__(self):
        return (self.__class__, (self.message, self.retry_after_s, self.remote))


class RemoteBadRequest(InvalidRequest):
    """The remote refused the request (400, 404, 413, 422): ``param`` as the remote named it, ``status``."""

    def __init__(self, message: str, param: Optional[str] = None, remote: str = "",
                 status: Optional[int] = None) -> None:
        super().__init__(message, param)
        self.remote, self.status = remote, status

    def __reduce__(self):
        return (self.__class__, (self.message, self.param, self.remote, self.status))
