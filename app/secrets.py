"""API keys of remote engines: where they live, how they are shown, and that no log line ever holds one.

The reasoning: docs/architecture.md, 'app/secrets.py'.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any, Optional

from app.errors import HearthError

SERVICE = "hearth"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REDACTED = "[redacted]"
_HEADER_RE = re.compile(r"(?i)\b(authorization|x-api-key|api-key)(['\"]?\s*[:=]\s*['\"]?)"
                        r"([^'\"\s,}]+(?: [^'\"\s,}]+)?)")
_BEARER_RE = re.compile(r"(?i)\b(bearer\s+)([A-Za-z0-9._~+/=-]{4,})")

_secrets: set[str] = set()
_lock = threading.Lock()


class SecretError(HearthError):
    """A key that should be there is not (an unset variable, no keyring entry), or the keyring failed."""


def keyring_user(name: str) -> str:
    """The keyring user name of remote ``name``'s key (service ``SERVICE``)."""
    return f"remote:{name}"


def check_env_name(var: str) -> str:
    """``var`` if it can name an environment variable, else ``SecretError`` (a key pasted in by mistake is
    refused here, and not echoed)."""
    if not isinstance(var, str) or not ENV_NAME_RE.match(var):
        raise SecretError("--api-key-env takes the NAME of an environment variable (letters, digits, _), not "
                          "the key itself")
    return var


def _keyring() -> Any:
    try:
        import keyring
    except ImportError:
        raise SecretError("the keyring package is not installed (pip install keyring); use --api-key-env "
                          "VAR instead") from None
    return keyring


def store_key(name: str, key: str) -> None:
    """Put remote ``name``'s key in the OS keyring. ``SecretError`` when there is no usable keyring."""
    if not key:
        raise SecretError("the API key is empty")
    kr = _keyring()
    try:
        kr.set_password(SERVICE, keyring_user(name), key)
    except Exception as exc:  # noqa: BLE001 - keyring's errors (no backend, locked, denied) are all one thing here
        raise SecretError(f"cannot store the key in the OS keyring ({type(exc).__name__}: {_safe(exc, key)}); "
                          "use --api-key-env VAR instead") from None
    register_secret(key)


def read_key(name: str) -> Optional[str]:
    """Remote ``name``'s key from the keyring (None when there is none). ``SecretError`` when it fails."""
    kr = _keyring()
    try:
        key = kr.get_password(SERVICE, keyring_user(name))
    except Exception as exc:  # noqa: BLE001
        raise SecretError(f"cannot read the key of remote {name!r} from the OS keyring "
                          f"({type(exc).__name__}: {exc})") from None
    if key:
        register_secret(key)
    return key or None


def delete_key(name: str) -> bool:
    """Remove remote ``name``'s key from the keyring; False when there was none (or no keyring)."""
    try:
        kr = _keyring()
        kr.delete_password(SERVICE, keyring_user(name))
        return True
    except Exception:  # noqa: BLE001 - PasswordDeleteError, no backend, no package: nothing to delete
        return False


def api_key_for(name: str, remote: Any, env: Optional[dict] = None) -> Optional[str]:
    """The key of remote ``name`` (an ``app.settings.RemoteSettings``): from ``$api_key_env``, or from the
    keyring when ``api_key_keyring``; None when it has no key. ``SecretError`` names what is missing."""
    environ = os.environ if env is None else env
    var = getattr(remote, "api_key_env", None)
    if var:
        key = environ.get(var)
        if not key:
            raise SecretError(f"the API key of remote {name!r} is read from the environment variable ${var}, "
                              "which is not set")
        register_secret(key)
        return key
    if getattr(remote, "api_key_keyring", False):
        key = read_key(name)
        if not key:
            raise SecretError(f"the API key of remote {name!r} should be in the OS keyring (service "
                              f"{SERVICE!r}, user {keyring_user(name)!r}) and is not; store it again with "
                              f"`hearth remote add {name} URL --api-key-keyring`")
        return key
    return None


def key_source(name: str, remote: Any) -> str:
    """Where remote ``name``'s key comes from, for a person (never the key): ``$VAR``, the keyring, or none."""
    if getattr(remote, "api_key_env", None):
        return f"${remote.api_key_env}"
    if getattr(remote, "api_key_keyring", False):
        return f"the OS keyring ({SERVICE}/{keyring_user(name)})"
    return ""


def mask(key: Optional[str]) -> str:
    """A key as it may be shown: ``…`` and its last 4 characters when it has 16 or more, else ``****``;
    ``(none)`` for no key."""
    if not key:
        return "(none)"
    return f"…{key[-4:]}" if len(key) >= 16 else "****"


def register_secret(value: Optional[str]) -> None:
    """Redact ``value`` from every log record from now on (values under 4 characters are not registered:
    redacting them would mangle ordinary words)."""
    if value and len(value) >= 4:
        with _lock:
            _secrets.add(value)


def redact(text: str) -> str:
    """``text`` with registered keys and ``Authorization`` / ``x-api-key`` / ``Bearer`` values replaced."""
    with _lock:
        values = sorted(_secrets, key=len, reverse=True)
    for v in values:
        if v in text:
            text = text.replace(v, REDACTED)
    text = _HEADER_RE.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    return _BEARER_RE.sub(lambda m: m.group(1) + REDACTED, text)


def _safe(exc: BaseException, key: str) -> str:
    return str(exc).replace(key, REDACTED) if key else str(exc)


class RedactingFilter(logging.Filter):
    """Rewrites each record's message (and its exception text) through ``redact``; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the logging module's to report
            return True
        clean = redact(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


_FILTER = RedactingFilter()


def install_redaction(logger: Optional[logging.Logger] = None) -> None:
    """Put the redacting filter on ``logger``'s handlers (default: the root logger's) and on the ``app``
    and ``app.engine.remote.engine`` loggers; idempotent. Call again after adding handlers
    (``logging.basicConfig``)."""
    target = logger if logger is not None else logging.getLogger()
    for obj in (target, *target.handlers, logging.getLogger("app"), logging.getLogger("app.engine.remote.engine")):
        if _FILTER not in obj.filters:
            obj.addFilter(_FILTER)
