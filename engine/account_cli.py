"""cotrain login | register | logout: prompts, and telling the user where the token went."""

from __future__ import annotations

import argparse
import getpass
import sys

from engine.credentials import CredentialsError, CredentialStore
from engine.login import AccountError, log_in, log_out, register
from engine.wire.rest import check_username


def stored_token(backbone: str) -> str | None:
    """The token kept for ``backbone``, announcing a file fallback on stderr."""
    login, where, in_keyring = CredentialStore().find(backbone)
    if login is None:
        return None
    if not in_keyring:
        print(f"using the login of {login.username} stored {where}", file=sys.stderr)
    return login.token


def _ask(prompt: str) -> str:
    return input(prompt).strip()


async def run_account_command(args: argparse.Namespace) -> int:
    store = CredentialStore()
    try:
        if args.command == "logout":
            return await _logout(store, args.backbone)
        username = args.username or _ask("username: ")
        if args.command == "register":
            check_username(username)  # before the password is asked for
        password = getpass.getpass("password: ")
        if args.command == "register":
            if getpass.getpass("password again: ") != password:
                print("the passwords differ; nothing was created", file=sys.stderr)
                return 1
            login = await register(args.backbone, username, password)
        else:
            login = await log_in(args.backbone, username, password)
        kept = store.save(args.backbone, login)
    except (AccountError, CredentialsError, ValueError) as exc:
        print(f"cotrain {args.command}: {exc}", file=sys.stderr)
        return 1
    except (EOFError, KeyboardInterrupt):
        print("\ncancelled", file=sys.stderr)
        return 130
    print(f"logged in to {args.backbone} as {login.username}; the token is kept {kept}")
    return 0


async def _logout(store: CredentialStore, backbone: str) -> int:
    login = store.load(backbone)
    if login is None:
        print(f"not logged in to {backbone}")
        return 0
    revoked = True
    try:
        await log_out(backbone, login.token)
    except AccountError as exc:
        revoked = False
        print(f"the backbone could not revoke the token ({exc}); forgetting it here anyway",
              file=sys.stderr)
    store.delete(backbone)
    print(f"logged out of {backbone}" + ("" if revoked else " on this machine"))
    return 0
