"""Where login tokens live: the OS keyring, or — said out loud — a file only you can read.

One entry per backbone URL. A machine with no keyring (a headless Linux box) gets a 0600
JSON file in the user's data folder, and every command that uses it says so.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import keyring
import keyring.errors

from engine.paths import user_data_dir
from engine.urls import backbone_key

log = logging.getLogger(__name__)
SERVICE = "cotrain"


@dataclass
class Login:
    username: str
    token: str


class CredentialsError(RuntimeError):
    """The keyring refused (locked, denied); the message says what to do."""


class CredentialStore:
    def __init__(self, fallback: Path | None = None) -> None:
        self.fallback = fallback or user_data_dir() / "credentials.json"

    @property
    def uses_keyring(self) -> bool:
        backend = keyring.get_keyring()
        module = type(backend).__module__
        return not (module.startswith("keyring.backends.fail") or module.startswith("keyring.backends.null")
                    or getattr(backend, "priority", 1) <= 0)

    def where(self) -> str:
        """A sentence for the user: where their login is kept."""
        if self.uses_keyring:
            return f"in your system keyring ({type(keyring.get_keyring()).__name__})"
        return self._in_file("no system keyring is available on this machine")

    def _in_file(self, because: str) -> str:
        return f"in {self.fallback} (readable only by you), because {because}"

    def save(self, url: str, login: Login) -> str:
        """Keep the login; returns where it went, in words, for the user to be told."""
        key = backbone_key(url)
        because = "no system keyring is available on this machine"
        if self.uses_keyring:
            try:
                keyring.set_password(SERVICE, key, json.dumps(asdict(login)))
                return self.where()
            except keyring.errors.KeyringLocked:
                raise CredentialsError("your keyring is locked: unlock it and try again") from None
            except keyring.errors.NoKeyringError as exc:
                because = f"the system keyring is not working ({exc or type(exc).__name__})"
            except keyring.errors.PasswordSetError as exc:
                raise CredentialsError(f"the keyring refused to store the login: {exc}") from None
        entries = self._read_file()
        entries[key] = asdict(login)
        self._write_file(entries)
        return self._in_file(because)

    def load(self, url: str) -> Login | None:
        return self.find(url)[0]

    def find(self, url: str) -> tuple[Login | None, str, bool]:
        """The login kept for ``url``, where it is kept (in words), and whether that is the
        keyring: a token read from the file is announced wherever it is used."""
        key = backbone_key(url)
        because = "no system keyring is available on this machine"
        if self.uses_keyring:
            try:
                raw = keyring.get_password(SERVICE, key)
            except keyring.errors.KeyringLocked:
                raise CredentialsError("your keyring is locked: unlock it and try again") from None
            except keyring.errors.NoKeyringError as exc:
                raw, because = None, f"the system keyring is not working ({exc or type(exc).__name__})"
            if raw is not None:
                return _parse(raw), self.where(), True
        entry = self._read_file().get(key)
        if entry:
            return Login(**entry), self._in_file(because), False
        return None, self.where(), self.uses_keyring

    def delete(self, url: str) -> bool:
        """Forget the login; True if there was one."""
        key = backbone_key(url)
        found = False
        if self.uses_keyring:
            try:
                keyring.delete_password(SERVICE, key)
                found = True
            except (keyring.errors.PasswordDeleteError, keyring.errors.NoKeyringError):
                pass
        entries = self._read_file()
        if entries.pop(key, None) is not None:
            self._write_file(entries)
            found = True
        return found

    def _read_file(self) -> dict:
        try:
            data = json.loads(self.fallback.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable %s: %s", self.fallback, exc)
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict)
                and isinstance(v.get("username"), str) and isinstance(v.get("token"), str)}

    def _write_file(self, entries: dict) -> None:
        self.fallback.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.fallback.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(entries, fh, indent=1)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.fallback)


def _parse(raw: str) -> Login | None:
    try:
        data = json.loads(raw)
        return Login(str(data["username"]), str(data["token"]))
    except (ValueError, KeyError, TypeError):
        return None
