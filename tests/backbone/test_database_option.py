"""`cotrain backbone --database`: a PostgreSQL server behind the backbone's records, what
an operator gets when it is wrong or away, and processes opening one database together."""

import subprocess
import threading

from engine.backbone.store.repositories import Store
from engine.paths import engine_command
from tests.postgres import free_port


def backbone(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*engine_command(), "backbone", "--port", "0", "--data-dir", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=60)


def test_a_database_that_is_not_postgresql_is_refused_before_anything_starts(tmp_path):
    ran = backbone(tmp_path / "data", "--database", "sqlite:///tmp/x.db")
    assert ran.returncode == 2
    assert "--database takes a postgresql:// URL" in ran.stderr and "Traceback" not in ran.stderr
    assert not (tmp_path / "data").exists()


def test_an_unreachable_server_is_named_without_its_password(tmp_path):
    url = f"postgresql://cotrain:hunter2-secret@127.0.0.1:{free_port()}/records"
    ran = backbone(tmp_path, "--database", url)
    assert ran.returncode == 1, ran.stderr
    assert "cannot use the database cotrain@127.0.0.1:" in ran.stderr and "/records" in ran.stderr
    assert "hunter2" not in ran.stderr + ran.stdout and "Traceback" not in ran.stderr


def test_a_database_written_by_a_newer_cotrain_is_refused_clearly(tmp_path, postgres):
    url = postgres.new_database()
    store = Store(url)
    store.database.execute("UPDATE meta SET value='999' WHERE key='schema'")
    store.close()
    ran = backbone(tmp_path, "--database", url)
    assert ran.returncode == 1 and "written by a newer Cotrain (schema 999)" in ran.stderr, ran.stderr


def test_processes_opening_one_new_database_together_all_get_one_schema(postgres):
    url = postgres.new_database()
    opened: list[Store] = []
    failed: list[BaseException] = []
    go = threading.Barrier(4)

    def open_store() -> None:
        go.wait(timeout=30)
        try:
            opened.append(Store(url))
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failed and len(opened) == 4
    alice = opened[0].accounts.create_user("alice", b"s", b"h")
    assert all(s.accounts.user_secret("ALICE").user == alice for s in opened)
    for s in opened:
        s.close()
