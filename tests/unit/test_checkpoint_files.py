"""Checkpoint uploads on the backbone's disk: kept only when they are what they claim to be,
under their content's name."""

import hashlib
import os
import time
from pathlib import Path

import pytest
import torch

from engine.backbone import checkpoints
from engine.backbone.checkpoints import GRACE, CheckpointFiles, CheckpointRejected
from engine.training.state import pack_state, state_sha256
from engine.wire.tensors import encode_file


def state_file(epoch: int) -> tuple[bytes, str]:
    torch.manual_seed(epoch)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    index, payload = pack_state(model, optimizer, epoch, "p")
    return encode_file(index, payload), state_sha256(model, optimizer, epoch)


async def chunks(data: bytes, size: int = 1000):
    for start in range(0, len(data), size):
        yield data[start:start + size]


async def receive(files, data, epoch, *, sha=None, params_sha, max_bytes=1 << 20):
    sha = sha or hashlib.sha256(data).hexdigest()
    return await files.receive(epoch, chunks(data), expected_sha256=sha,
                               expected_state_sha256=params_sha, max_bytes=max_bytes)


async def test_a_genuine_checkpoint_is_kept_whole(tmp_path):
    files = CheckpointFiles(tmp_path)
    data, params = state_file(3)
    path, digest, size = await receive(files, data, 3, params_sha=params)
    assert (digest, size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert path == files.path(digest) == tmp_path / digest[:2] / f"{digest}.ckpt"
    assert path.read_bytes() == data
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [path]
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)


async def test_two_processes_storing_one_state_share_one_file(tmp_path):
    """(Two backbone processes on one shared folder, say, each receiving the same upload.)"""
    data, params = state_file(3)
    first = await receive(CheckpointFiles(tmp_path), data, 3, params_sha=params)
    second = await receive(CheckpointFiles(tmp_path), data, 3, params_sha=params)
    assert first == second
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [first[0]]


async def test_a_file_just_published_outlives_a_removal_another_process_decided_before(tmp_path):
    """Process A drops its last record of a state while process B stores the same state:
    A judged the file unused before B recorded it. The file stays until it is older than
    the grace, and a sweep then removes only what no record names."""
    data, params = state_file(3)
    other, _ = state_file(4)
    a, b = CheckpointFiles(tmp_path), CheckpointFiles(tmp_path)
    path, digest, _ = await receive(b, data, 3, params_sha=params)
    assert not await a.remove(digest) and path.is_file()
    stale, _, _ = await receive(b, other, 4, params_sha=state_file(4)[1])
    long_ago = time.time() - GRACE - 1
    for p in (path, stale):
        os.utime(p, (long_ago, long_ago))
    legacy = tmp_path / "ab" / "epoch-00000005.ckpt"  # (a project "ab", as an older Cotrain kept it)
    legacy.parent.mkdir(exist_ok=True)
    legacy.write_bytes(data)
    os.utime(legacy, (long_ago, long_ago))
    recorded = {digest}
    assert await a.sweep(recorded.__contains__) == 1
    assert path.is_file() and not stale.exists() and legacy.is_file()
    assert await a.remove(digest) and not path.exists()


async def test_a_removal_puts_back_a_file_published_between_its_look_and_its_move(tmp_path, monkeypatch):
    data, params = state_file(3)
    files = CheckpointFiles(tmp_path)
    path, digest, _ = await receive(files, data, 3, params_sha=params)
    long_ago = time.time() - GRACE - 1
    os.utime(path, (long_ago, long_ago))
    rename = os.rename

    def published_meanwhile(source, target):
        if Path(source) == path:  # another process publishes the same content under the name
            os.utime(path)
        rename(source, target)

    monkeypatch.setattr(checkpoints.os, "rename", published_meanwhile)
    assert not await files.remove(digest)
    assert path.read_bytes() == data and [p for p in tmp_path.rglob("*") if p.is_file()] == [path]


async def test_a_checked_upload_counts_its_age_from_when_it_was_published(tmp_path, monkeypatch):
    """Checking a large upload can take longer than the grace: its age starts once it is in place."""
    data, params = state_file(3)
    verify = checkpoints._verify

    def slow_verify(tmp, epoch, state_sha256):
        long_ago = time.time() - GRACE - 1
        os.utime(tmp, (long_ago, long_ago))
        verify(tmp, epoch, state_sha256)

    monkeypatch.setattr(checkpoints, "_verify", slow_verify)
    files = CheckpointFiles(tmp_path)
    path, digest, _ = await receive(files, data, 3, params_sha=params)
    assert not await files.remove(digest) and path.is_file()


@pytest.mark.parametrize("damage, message", [
    ("checksum", "checksum does not match"),
    ("params", "state differs"),
    ("epoch", "holds epoch 3, not 4"),
    ("garbage", "not a valid state file"),
    ("size", "exceeds"),
])
async def test_a_bad_upload_is_refused_and_leaves_nothing_behind(tmp_path, damage, message):
    files = CheckpointFiles(tmp_path)
    data, params = state_file(3)
    epoch, sha, max_bytes = 3, None, 1 << 20
    if damage == "checksum":
        sha = "0" * 64
    elif damage == "params":
        params = state_file(5)[1]
    elif damage == "epoch":
        epoch = 4
    elif damage == "garbage":
        data = b"COTRAIN-STATE\0" + bytes(range(256)) * 8
    elif damage == "size":
        max_bytes = len(data) - 1
    with pytest.raises(CheckpointRejected, match=message):
        await receive(files, data, epoch, sha=sha, params_sha=params, max_bytes=max_bytes)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


async def test_a_large_upload_is_written_in_pieces_off_the_event_loop(tmp_path, monkeypatch):
    """Each write and the fsync run in a thread; the event loop only gathers the chunks."""
    import asyncio

    from engine.backbone import checkpoints

    monkeypatch.setattr(checkpoints, "WRITE_SIZE", 128)
    in_threads: list[str] = []
    real = asyncio.to_thread

    async def to_thread(work, *args, **kwargs):
        in_threads.append(work.__name__)
        return await real(work, *args, **kwargs)

    monkeypatch.setattr(checkpoints.asyncio, "to_thread", to_thread)
    data, params = state_file(3)
    path, _, _ = await CheckpointFiles(tmp_path).receive(
        3, chunks(data, 50), expected_sha256=hashlib.sha256(data).hexdigest(),
        expected_state_sha256=params, max_bytes=1 << 20)
    assert path.read_bytes() == data
    assert in_threads.count("_append") == len(data) // 150  # every third chunk of 50 bytes
    assert {"_create", "_finish", "_verify", "_publish"} <= set(in_threads)


def test_at_start_half_written_uploads_go_and_everything_left_is_private_again(tmp_path):
    files = CheckpointFiles(tmp_path / "checkpoints")
    folder = tmp_path / "checkpoints" / "ab"
    folder.mkdir(parents=True)
    kept, leftover = folder / f"{'ab' * 32}.ckpt", folder.parent / ".incoming-0123abcd"
    kept.write_bytes(b"state")
    leftover.write_bytes(b"half a sta")
    for path, mode in ((kept, 0o644), (leftover, 0o644), (folder, 0o755), (folder.parent, 0o755)):
        path.chmod(mode)
    files.tidy()
    assert [p.name for p in folder.iterdir()] == [kept.name]
    assert kept.stat().st_mode & 0o777 == 0o600
    assert folder.stat().st_mode & 0o777 == folder.parent.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("content", ["genuine", "not the recorded one"])
def test_a_file_an_earlier_version_kept_by_epoch_moves_to_its_content_name(tmp_path, content):
    files = CheckpointFiles(tmp_path)
    data, _ = state_file(3)
    digest = hashlib.sha256(data).hexdigest()
    old = tmp_path / "p" / "epoch-00000003.ckpt"
    old.parent.mkdir()
    old.write_bytes(data if content == "genuine" else data[:-1])
    files.adopt("p", 3, digest)
    if content == "genuine":
        assert files.path(digest).read_bytes() == data and not old.exists()
    else:  # left for its owner to look at; the record finds no file (a 503 names it)
        assert old.exists() and not files.path(digest).exists()
