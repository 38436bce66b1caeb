"""Where login tokens go: a real keyring backend when there is one, else a visible 0600 file."""

import stat

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import null

from engine.credentials import CredentialStore, Login
from engine.urls import backbone_key


def memory_keyring() -> KeyringBackend:
    """An in-memory backend. Defined when a test asks for it: keyring registers every
    subclass of KeyringBackend, and one defined at import time would become the default
    backend of every other test in this process."""

    class MemoryKeyring(KeyringBackend):
        priority = 1

        def __init__(self):
            super().__init__()
            self.entries = {}

        def get_password(self, service, username):
            return self.entries.get((service, username))

        def set_password(self, service, username, password):
            self.entries[(service, username)] = password

        def delete_password(self, service, username):
            if self.entries.pop((service, username), None) is None:
                raise keyring.errors.PasswordDeleteError(username)

    return MemoryKeyring()


@pytest.fixture
def restore_keyring():
    previous = keyring.get_keyring()
    yield
    keyring.set_keyring(previous)


def test_logins_go_to_the_keyring_when_there_is_one(tmp_path, restore_keyring):
    backend = memory_keyring()
    keyring.set_keyring(backend)
    store = CredentialStore(tmp_path / "credentials.json")
    kept = store.save("http://Example.org:8470/", Login("alice", "t0ken"))
    assert store.uses_keyring and "keyring" in kept == store.where()
    assert store.load("http://example.org:8470") == Login("alice", "t0ken")
    assert not (tmp_path / "credentials.json").exists()
    assert store.delete("http://example.org:8470") and store.load("http://example.org:8470") is None
    assert backend.entries == {}


def test_without_a_keyring_the_fallback_file_is_private_and_named(tmp_path, restore_keyring):
    keyring.set_keyring(null.Keyring())
    path = tmp_path / "cotrain" / "credentials.json"
    store = CredentialStore(path)
    store.save("http://127.0.0.1:8470", Login("bob", "s3cret"))
    assert not store.uses_keyring
    assert str(path) in store.where() and "no system keyring" in store.where()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert store.load("http://127.0.0.1:8470").token == "s3cret"
    store.delete("http://127.0.0.1:8470")
    assert store.load("http://127.0.0.1:8470") is None


def test_a_corrupt_fallback_file_is_ignored_not_fatal(tmp_path, restore_keyring):
    keyring.set_keyring(null.Keyring())
    path = tmp_path / "credentials.json"
    path.write_text("{not json")
    store = CredentialStore(path)
    assert store.load("http://127.0.0.1:1") is None
    store.save("http://127.0.0.1:1", Login("c", "t"))
    assert store.load("http://127.0.0.1:1") == Login("c", "t")


def test_a_keyring_that_fails_when_used_is_not_claimed_as_the_place_of_the_token(tmp_path, restore_keyring):
    backend = memory_keyring()

    def broken(service, username, password):
        raise keyring.errors.NoKeyringError("no D-Bus session")

    backend.set_password = broken
    keyring.set_keyring(backend)
    path = tmp_path / "credentials.json"
    store = CredentialStore(path)
    kept = store.save("http://127.0.0.1:8470", Login("erin", "t0k"))
    assert str(path) in kept and "not working (no D-Bus session)" in kept and "keyring (" not in kept
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    login, where, in_keyring = store.find("http://127.0.0.1:8470")
    assert login == Login("erin", "t0k") and not in_keyring and str(path) in where


@pytest.mark.parametrize("url", ["ftp://x", "not a url", "http://"])
def test_bad_backbone_urls_are_refused(url):
    with pytest.raises(ValueError):
        backbone_key(url)
