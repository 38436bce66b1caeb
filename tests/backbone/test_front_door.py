"""The deployment example's nginx sends each client to one backbone process: it hashes the
client as the backbone's per-address limits count it (engine/backbone/addresses.py), an
IPv4 address or an IPv6 address's /64. Hashing whole IPv6 addresses gave a host as many
budgets as there are processes: it picks among its /64's addresses at will."""

import ipaddress
import random

import aiohttp
import pytest

from engine.backbone.addresses import DEFAULT_IPV6_PREFIX
from engine.resources import resources_dir
from tests.front_door import FrontDoorMissing, nginx_binary, run_nginx
from tests.postgres import free_port


def group_of(address: str) -> str:
    """The /64 as the backbone counts it, written as nginx's key is: four groups in hex."""
    ip = ipaddress.ip_address(address)
    if ip.version == 4:
        return address
    if ip.ipv4_mapped:  # (an IPv4 client on a dual-stack socket)
        return str(ip.ipv4_mapped)
    return ":".join(f"{int(g, 16):x}" for g in ip.exploded.split(":")[:4])


def addresses(rng: random.Random, count: int) -> list[str]:
    """IPv6 addresses whose compressed forms put the "::" everywhere it can go, and IPv4 ones."""
    out = ["::", "::1", "1::", "::ffff:192.0.2.7", "2001:db8::", "2001:db8:0:1::", "0:0:0:5::1"]
    for _ in range(count):
        groups = [rng.choice((0, 0, 0, rng.randrange(1, 1 << 16))) for _ in range(8)]
        out.append(str(ipaddress.IPv6Address(b"".join(g.to_bytes(2, "big") for g in groups))))
    out += [str(ipaddress.IPv4Address(rng.randrange(1, 1 << 32))) for _ in range(20)]
    return out


@pytest.fixture
def keys(tmp_path):
    """nginx with the example's map, answering each request with the key it hashes the
    client by; the client's address is taken from a header (realip), as from a connection."""
    try:
        nginx_binary()
    except FrontDoorMissing as missing:
        pytest.skip(str(missing))
    site = (resources_dir() / "deploy" / "nginx-cotrain.conf").read_text()
    start, end = site.index("map $remote_addr $cotrain_client {"), site.index("upstream cotrain_backbones")
    port = free_port()
    (tmp_path / "site.conf").write_text(
        site[start:end] + f"server {{ listen 127.0.0.1:{port}; set_real_ip_from 127.0.0.1; "
        "real_ip_header X-Client; location / { return 200 $cotrain_client; } }\n")
    process = run_nginx(tmp_path)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        process.terminate()
        process.wait(30)


def test_the_example_hashes_the_client_by_the_key_its_map_makes():
    site = (resources_dir() / "deploy" / "nginx-cotrain.conf").read_text()
    assert "hash $cotrain_client consistent;" in site and "hash $remote_addr" not in site


async def test_every_address_of_a_64_reaches_nginx_as_one_key(keys):
    assert DEFAULT_IPV6_PREFIX == 64  # (what the map spells out)
    rng = random.Random(7)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for address in addresses(rng, 400):
            async with http.get(keys, headers={"X-Client": address}) as response:
                assert response.status == 200
                key = await response.text()
            assert key == group_of(address), address
