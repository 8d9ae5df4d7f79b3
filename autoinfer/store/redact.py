"""Storage URLs carry database passwords; nothing autoinfer prints, logs or stores may show them.

Every message that can contain a URL goes through `redact` (or `redact_url` for one URL): the password of
`scheme://user:password@host` and `password=` query values become `***`, everything else stays readable.
"""

from __future__ import annotations

import re

MASK = "***"
# scheme://user:password@ — the password runs to the last '@' before the host (an unescaped '@' in a password is
# common), never across whitespace or quotes.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*):(?P<secret>[^\s'\"]*)@")
_QUERY = re.compile(r"(?P<head>[?&;\s](?:password|passwd|pwd)=)(?P<secret>[^&\s'\"]+)", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with every URL password replaced by ***."""
    text = _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    return _QUERY.sub(lambda m: f"{m['head']}{MASK}", text)


def redact_url(url: str | None) -> str:
    """One storage URL as it may be shown (None shows as the empty string)."""
    return redact(url or "")
