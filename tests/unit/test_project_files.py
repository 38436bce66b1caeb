"""A project's files, from the backbone that serves its folder to a peer's cache: resumed
where a download stopped, refused when they are not what the manifest says, kept within
the volunteer's disk limit."""

import asyncio
import hashlib
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from engine.project import FileRef
from engine.project_folders import load_project_folder
from engine.shards import files as files_module
from engine.shards.cache import DiskBusy, DiskLimitError, ShardCache
from engine.shards.download import FileError
from engine.shards.files import FetchedFiles
from engine.shards.lock import exclusive
from tests.collab.harness import running_backbone
from tests.projects import albert_folder


def ref_of(data: bytes, path: str = "shards/x.jsonl") -> FileRef:
    return FileRef(path=path, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))


@pytest.fixture
def project(tmp_path):
    return albert_folder(tmp_path / "projects")


async def fetched(backbone_url: str, folder, cache_dir: Path, max_bytes: int = 10**9, progress=None):
    url = f"{backbone_url}/api/projects/{folder.spec.id}/files"
    return FetchedFiles(url, dict, ShardCache(cache_dir, max_bytes), asyncio.get_running_loop(), progress)


async def test_a_peer_fetches_every_file_and_reads_them_from_its_cache_after(tmp_path, project):
    async with running_backbone(tmp_path / "bb", projects_dir=project.root.parent) as backbone:
        files = await fetched(backbone.url, project, tmp_path / "cache")
        try:
            for ref in project.spec.data.files():
                path = await files.get(ref)
                assert path.read_bytes() == (project.root / ref.path).read_bytes()
            # The second time nothing travels: the cache answers from the thread the task runs on.
            shard = project.spec.data.shards[0]
            assert await asyncio.to_thread(files.local, shard) == files.cache.path(shard)
        finally:
            await files.close()


async def test_an_interrupted_download_resumes_where_it_stopped(tmp_path, project):
    shard = project.spec.data.shards[0]
    whole = (project.root / shard.path).read_bytes()
    cache = tmp_path / "cache"
    async with running_backbone(tmp_path / "bb", projects_dir=project.root.parent) as backbone:
        files = await fetched(backbone.url, project, cache, progress=lambda p, got, total: seen.append(got))
        seen: list[int] = []
        files.cache.part(shard).write_bytes(whole[: len(whole) // 2])  # what an earlier run left
        try:
            path = await files.get(shard)
        finally:
            await files.close()
    assert path.read_bytes() == whole
    assert seen and seen[0] > len(whole) // 2, "the download started again from the first byte"


async def test_the_backbone_serves_only_what_the_manifest_lists(tmp_path, project):
    async with running_backbone(tmp_path / "bb", projects_dir=project.root.parent) as backbone, \
            aiohttp.ClientSession() as http:
        base = f"{backbone.url}/api/projects/{project.spec.id}/files"
        for place in ("project.json", "../../backbone.sqlite3", "shards/../project.json", "nothing.txt"):
            async with http.get(f"{base}/{place}") as resp:
                assert resp.status == 404, place
        async with http.get(f"{base}/tokenizer.json", headers={"Range": "bytes=0-9"}) as resp:
            assert resp.status == 206 and len(await resp.read()) == 10


async def test_a_file_that_is_not_what_the_manifest_says_is_refused_and_not_kept(tmp_path, project,
                                                                                  monkeypatch):
    monkeypatch.setattr(files_module, "FIRST_PAUSE", 0.01)
    shard = project.spec.data.shards[0]
    forged = FileRef(path=shard.path, sha256="0" * 64, bytes=shard.bytes)
    async with running_backbone(tmp_path / "bb", projects_dir=project.root.parent) as backbone:
        files = await fetched(backbone.url, project, tmp_path / "cache")
        try:
            with pytest.raises(FileError, match="not the file the project lists") as caught:
                await files.get(forged)
        finally:
            await files.close()
    assert caught.value.bad
    assert files.cache.find(forged) is None and not files.cache.part(forged).exists()


async def test_a_server_sending_more_than_the_manifest_says_is_cut_off(tmp_path, monkeypatch):
    monkeypatch.setattr(files_module, "FIRST_PAUSE", 0.01)
    body = b"x" * 200_000
    sent = []

    async def endless(request):
        sent.append(1)
        return web.Response(body=body)

    app = web.Application()
    app.router.add_get("/shard", endless)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    ref = ref_of(body[:1000], f"http://127.0.0.1:{port}/shard")
    files = FetchedFiles("unused", dict, ShardCache(tmp_path / "cache", 10**9), asyncio.get_running_loop())
    try:
        with pytest.raises(FileError, match="larger than the project says"):
            await files.get(ref)
    finally:
        await files.close()
        await runner.cleanup()
    assert files.cache.part(ref).stat().st_size <= 1000


async def test_an_unreachable_shard_is_tried_again_then_given_up_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(files_module, "FIRST_PAUSE", 0.01)
    listener = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()  # nothing listens there now
    ref = ref_of(b"data", f"http://127.0.0.1:{port}/shard-0.jsonl")
    files = FetchedFiles("unused", dict, ShardCache(tmp_path / "cache", 10**9), asyncio.get_running_loop())
    try:
        with pytest.raises(FileError, match="stopped at 0 of 4 bytes"):
            await files.get(ref)
    finally:
        await files.close()


def test_the_least_recently_used_files_go_first_when_the_disk_limit_is_reached(tmp_path):
    cache = ShardCache(tmp_path, max_bytes=250)
    refs = []
    for i in range(3):
        data = bytes([i]) * 100
        ref = ref_of(data, f"shards/{i}")
        cache.make_room(ref)
        cache.part(ref).write_bytes(data)
        cache.store(ref)
        refs.append(ref)
        assert cache.used() <= 250
    # The third evicted the first (least recently used), not the second.
    assert cache.find(refs[0]) is None and cache.find(refs[1]) and cache.find(refs[2])
    cache.find(refs[1])  # used again: now the third is the oldest
    fourth = ref_of(b"\x09" * 100, "shards/3")
    cache.make_room(fourth)
    assert cache.find(refs[2]) is None and cache.find(refs[1]) is not None


async def test_downloads_started_together_stay_within_the_disk_limit(tmp_path, project):
    """Before: each download counted the others at their partial sizes, and three 8 MB files
    started together under a 10 MB limit held 24 MB. Now each reserves its size; one that
    would fit but for the others' waits for them, and what cannot fit is refused by name."""
    shards = project.spec.data.shards[:4]
    limit = shards[0].bytes + shards[1].bytes + 1000
    cache_dir, peak = tmp_path / "cache", [0]

    def on_disk() -> int:
        return sum(p.stat().st_size for p in cache_dir.rglob("*") if p.is_file() and p.suffix == "")

    def sample(path, got, total) -> None:
        peak[0] = max(peak[0], on_disk())
    async with running_backbone(tmp_path / "bb", projects_dir=project.root.parent) as backbone:
        files = await fetched(backbone.url, project, cache_dir, max_bytes=limit, progress=sample)
        try:
            results = await asyncio.gather(*(files.get(ref) for ref in shards), return_exceptions=True)
        finally:
            await files.close()
    stored = [r for r in results if isinstance(r, Path)]
    refused = [r for r in results if not isinstance(r, Path)]
    assert len(stored) == 2 and all(isinstance(r, DiskLimitError) for r in refused), results
    assert all("disk limit" in str(r) for r in refused)
    assert max(peak[0], on_disk()) <= limit, (peak[0], limit)


async def test_room_other_downloads_hold_is_waited_for_and_a_crashed_ones_is_not(tmp_path):
    cache = ShardCache(tmp_path, max_bytes=250)
    first, second = ref_of(b"a" * 100, "shards/a"), ref_of(b"b" * 200, "shards/b")
    async with exclusive(cache.lock(first)):  # a download under way
        cache.make_room(first)
        with pytest.raises(DiskBusy):
            cache.make_room(second)
        cache.release(first)  # it ended (stored elsewhere, or given up)
        cache.make_room(second)
    cache.release(second)
    # A process that died mid-download holds no lock: its reservation does not count.
    cache.reservation(first).write_text("240")
    cache.make_room(second)
    assert not cache.reservation(first).exists()


def test_a_file_larger_than_the_disk_limit_is_refused_with_the_figures(tmp_path):
    cache = ShardCache(tmp_path, max_bytes=10**6)
    with pytest.raises(DiskLimitError, match=r"needs 0.00 GB; the disk limit is 0.00 GB"):
        cache.make_room(FileRef(path="shards/big", sha256="a" * 64, bytes=2 * 10**6))


def test_a_folder_whose_files_do_not_match_its_manifest_does_not_load(tmp_path, project):
    shard = project.root / project.spec.data.shards[0].path
    shard.write_bytes(shard.read_bytes() + b"\n")
    with pytest.raises(ValueError, match=r"bytes; .*project.json says"):
        load_project_folder(project.root)


async def test_peers_sharing_a_cache_in_one_process_with_its_backbone_all_get_their_files(tmp_path, project):
    """Waiting for another download's lock held a thread of asyncio's default executor; with
    more waiters than its threads, the backbone in the same process could not open the file
    the lock holder was fetching, and every download stalled (CI: three peers, two minutes)."""
    shards = project.spec.data.shards
    async with running_backbone(tmp_path / "bb", projects_dir=project.root.parent) as backbone:
        peers = [await fetched(backbone.url, project, tmp_path / "cache") for _ in range(12)]
        try:
            got = await asyncio.wait_for(
                asyncio.gather(*(files.get(ref) for files in peers for ref in shards)), 20)
        finally:
            for files in peers:
                await files.close()
    assert [path.read_bytes() for path in got] == \
        [(project.root / ref.path).read_bytes() for _ in peers for ref in shards]
