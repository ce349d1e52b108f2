"""Local accounts: argon2 password hashes, made and checked off the event loop.

``pluto admin add NAME --role owner`` creates one (the first account of a gateway should be an
owner); the console's owners add, change and remove others. A wrong password and an unknown
name take the same time and get the same answer.
"""

from __future__ import annotations

import asyncio
import functools
import re

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from pluto.errors import PlutoError
from pluto.gateway.console.access import ROLES, Role

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}")
MIN_PASSWORD = 12
MAX_PASSWORD = 1024


class AccountError(PlutoError, ValueError):
    """A name, role or password that cannot be used; the message says why."""


@functools.lru_cache(maxsize=1)
def _hasher() -> PasswordHasher:
    return PasswordHasher()  # argon2id, the library's (RFC 9106 low-memory) parameters


@functools.lru_cache(maxsize=1)
def _decoy() -> str:
    return _hasher().hash("a password nobody has, to spend the same time on unknown names")


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name or ""):
        raise AccountError("an account name is 1-64 letters, digits and _ . @ + - (starting "
                           "with a letter or digit)")
    return name


def check_role(role: str) -> Role:
    if role not in ROLES:
        raise AccountError(f"no role {role!r}: one of {', '.join(ROLES)}")
    return role  # type: ignore[return-value]


def check_password(password: str) -> str:
    if len(password) < MIN_PASSWORD:
        raise AccountError(f"a password needs at least {MIN_PASSWORD} characters")
    if len(password) > MAX_PASSWORD:
        raise AccountError(f"a password has at most {MAX_PASSWORD} characters")
    return password


async def hash_password(password: str) -> str:
    check_password(password)
    return await asyncio.to_thread(_hasher().hash, password)


def _verify(stored: str | None, password: str) -> bool:
    try:
        return _hasher().verify(stored or _decoy(), password) and stored is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


async def verify_password(stored: str | None, password: str) -> bool:
    """Whether ``password`` matches ``stored`` (None: an unknown account — checked against a
    decoy all the same, so the answer takes as long)."""
    if not password or len(password) > MAX_PASSWORD:
        return False
    return await asyncio.to_thread(_verify, stored, password)
