"""Passwords out of text: URLs masked for display, secrets removed from messages.

Every line the engine, the CLI and the console show may hold a database or broker URL,
or a driver's message echoing a password; these functions mask them. Only the password
goes: ``postgresql+asyncpg://fv:fv@host/fv`` shows as ``postgresql+asyncpg://fv:***@host/fv``.
"""

from __future__ import annotations

import re

from sqlalchemy.engine import URL, make_url


def mask_url(url: str | URL) -> str:
    """The URL with its password (in the credentials or the query) replaced by ``***``.

    A string is masked as written, not parsed: a password with a raw ``@`` (which a
    parser splits at the first ``@``) is masked up to the last one.
    """
    text = (
        url.render_as_string(hide_password=True)
        if isinstance(url, URL)
        else _URL_CREDENTIALS.sub(r"\1***@", url)
    )
    return _QUERY_PASSWORD.sub(r"\1***", text)


def raw_at_in_password(url: str) -> bool:
    """Whether the URL's credentials hold more than one ``@``: a password typed with a raw
    ``@`` (to be written %40), which parsers split differently (part of it would become
    the host, and show up in errors)."""
    credentials = _RAW_PASSWORD.search(url)
    return credentials is not None and "@" in credentials.group(1)


# user:password@ of a URL in any text; the password runs to the last @ of its token (no
# space, quote or angle bracket), so one holding a raw @ is masked whole.
_URL_CREDENTIALS = re.compile(r"(://[^:/@\s\"'<>]*:)[^\s\"'<>]*@")
_RAW_PASSWORD = re.compile(r"://[^:/@\s\"'<>]*:([^\s\"'<>]+)@")
_QUERY_PASSWORD = re.compile(r"([?&](?:password|passwd|pwd|pass)=)[^&\s'\"]*", re.IGNORECASE)
# A bare password is masked only where no word, dash or dot touches it.
_EDGE = r"[\w.-]"
# A URL in running text (kept whole by the split: the capture group).
_URL_TOKEN = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^\s\"'<>]*)")


def mask_secrets(message: str, *urls: str | URL) -> str:
    """Remove passwords from text: credentials inside any URL, and the passwords of ``urls``.

    A bare password (a driver echoing it) is masked only where it stands as a
    whole token, in its decoded and its percent-encoded spelling, so a short or
    common password ("postgres") cannot mangle words like "postgresql".
    """
    message = _QUERY_PASSWORD.sub(r"\1***", _URL_CREDENTIALS.sub(r"\1***@", message))
    secrets = sorted(_password_spellings(urls), key=len, reverse=True)
    if not secrets:
        return message
    # Inside a URL only its password is a secret, and that is masked above: a user or a
    # database named like the password ("fv:fv@host/fv") stays readable.
    pieces = _URL_TOKEN.split(message)
    for index in range(0, len(pieces), 2):  # the text between URLs
        for secret in secrets:
            pattern = rf"(?<!{_EDGE}){re.escape(secret)}(?!{_EDGE})"
            pieces[index] = re.sub(pattern, "***", pieces[index])
    return "".join(pieces)


def _password_spellings(urls: tuple[str | URL, ...]) -> set[str]:
    spellings: set[str] = set()
    for url in urls:
        if isinstance(url, URL):
            if url.password:
                spellings.add(str(url.password))
            continue
        password = _password_of(url)
        if password:
            spellings.add(password)
        typed = _RAW_PASSWORD.search(url)
        if typed:
            spellings.add(typed.group(1))
        for match in re.finditer(r"[?&](?:password|passwd|pwd|pass)=([^&\s]+)", url, re.I):
            spellings.add(match.group(1))
    return spellings


def _password_of(url: str) -> str | None:
    try:
        password = make_url(url).password
    except Exception:
        return None
    return None if password is None else str(password)
