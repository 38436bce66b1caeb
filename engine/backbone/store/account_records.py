"""Accounts and their log-in tokens (stored as hashes only): a token expires unused after
TOKEN_IDLE, and each user sees and revokes their own log-ins."""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.backbone.accounts import PASSWORD_HASH
from engine.backbone.store.database import Conflict, Repository
from engine.wire.rest import LoginSession

TOKEN_IDLE = 90 * 86400.0  # a log-in unused this long expires
TOKEN_TOUCH = 3600.0  # how stale a token's last use may be recorded


@dataclass
class User:
    id: int
    username: str


@dataclass(frozen=True)
class Secret:
    """What a log-in is checked against: the password's salt, hash and hash parameters."""

    user: User
    salt: bytes
    password_hash: bytes
    kdf: str


class UsernameTaken(ValueError):
    pass


class AccountRecords(Repository):
    def create_user(self, username: str, salt: bytes, password_hash: bytes,
                    kdf: str = PASSWORD_HASH.text) -> User:
        try:
            row = self.db.execute(
                "INSERT INTO users (username, salt, password_hash, created_at, kdf) VALUES (?,?,?,?,?) "
                "RETURNING id", (username, salt, password_hash, time.time(), kdf),
            ).fetchone()
        except Conflict:
            raise UsernameTaken(username) from None
        return User(row[0], username)

    def user_secret(self, username: str) -> Secret | None:
        row = self.db.execute(
            f"SELECT id, username, salt, password_hash, kdf FROM users WHERE {self.dialect.username_is}",
            (username,)
        ).fetchone()
        return Secret(User(row[0], row[1]), bytes(row[2]), bytes(row[3]), row[4]) if row else None

    def set_password(self, user_id: int, salt: bytes, password_hash: bytes, kdf: str) -> None:
        self.db.execute("UPDATE users SET salt=?, password_hash=?, kdf=? WHERE id=?",
                        (salt, password_hash, kdf, user_id))

    def add_token(self, user: User, token_sha256: str, client: str = "") -> None:
        now = time.time()
        self.db.execute("INSERT INTO tokens (token_sha256, user_id, created_at, revoked_at, last_used, "
                        "client) VALUES (?,?,?,NULL,?,?)",
                        (token_sha256, user.id, now, now, client))

    def user_for_token(self, token_sha256: str) -> User | None:
        """The token's user, if it is neither revoked nor unused for TOKEN_IDLE; each use
        pushes its expiry back (written at most once per TOKEN_TOUCH)."""
        now = time.time()
        row = self.db.execute(
            "SELECT users.id, users.username, COALESCE(tokens.last_used, tokens.created_at) FROM tokens "
            "JOIN users ON users.id = tokens.user_id WHERE token_sha256=? AND revoked_at IS NULL",
            (token_sha256,),
        ).fetchone()
        if row is None or now - row[2] > TOKEN_IDLE:
            return None
        if now - row[2] > TOKEN_TOUCH:
            self.db.execute("UPDATE tokens SET last_used=? WHERE token_sha256=?", (now, token_sha256))
        return User(row[0], row[1])

    def revoke_token(self, token_sha256: str) -> None:
        self.db.execute("UPDATE tokens SET revoked_at=? WHERE token_sha256=?", (time.time(), token_sha256))

    def tokens(self, user_id: int, current_sha256: str) -> list[LoginSession]:
        """The user's live log-ins, most recently used first."""
        horizon = time.time() - TOKEN_IDLE
        rows = self.db.execute(
            f"SELECT {self.dialect.token_id}, client, created_at, COALESCE(last_used, created_at), "
            "token_sha256 FROM tokens "
            "WHERE user_id=? AND revoked_at IS NULL AND COALESCE(last_used, created_at) >= ? "
            "ORDER BY 4 DESC", (user_id, horizon),
        ).fetchall()
        return [LoginSession(r[0], r[1] or "unknown client", r[2], r[3], r[3] + TOKEN_IDLE,
                             r[4] == current_sha256) for r in rows]

    def revoke_token_id(self, user_id: int, session_id: int) -> bool:
        """Revoke the user's token ``session_id``; False if it has no such live token."""
        cursor = self.db.execute(
            f"UPDATE tokens SET revoked_at=? WHERE {self.dialect.token_id}=? AND user_id=? "
            "AND revoked_at IS NULL",
            (time.time(), session_id, user_id))
        return cursor.rowcount == 1
