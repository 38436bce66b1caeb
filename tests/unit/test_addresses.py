"""Address groups: what per-address limits count as one address."""

import pytest

from engine.backbone.addresses import address_group, plain_address


@pytest.mark.parametrize("address, group", [
    ("203.0.113.7", "203.0.113.7"),
    ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::/64"),
    ("2001:DB8:1:2::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
    ("::ffff:203.0.113.7", "203.0.113.7"),  # IPv4 on a dual-stack socket is IPv4
    ("fe80::1%eth0", "fe80::/64"),
    ("::1", "::/64"),
    ("unknown", "unknown"),
])
def test_ipv4_counts_by_address_and_ipv6_by_its_64(address, group):
    assert address_group(address, 64) == group


def test_every_address_a_host_picks_in_its_64_is_one_group_and_the_next_64_another():
    one = {address_group(f"2001:db8:a:b:{i:x}:{i * 7:x}::{i * 13:x}", 64) for i in range(1, 5000)}
    assert one == {"2001:db8:a:b::/64"}
    assert address_group("2001:db8:a:c::1", 64) != "2001:db8:a:b::/64"


def test_the_prefix_is_the_owners_choice():
    assert address_group("2001:db8:1:2:3::1", 48) == "2001:db8:1::/48"
    assert address_group("2001:db8:1:2:3::1", 128) == "2001:db8:1:2:3::1/128"
    assert address_group("203.0.113.7", 48) == "203.0.113.7"
    with pytest.raises(ValueError):
        address_group("2001:db8::1", 129)


def test_a_group_is_its_own_group():
    group = address_group("2001:db8:1:2::99", 64)
    assert address_group(group, 64) == group
    assert address_group(address_group("198.51.100.4", 64), 64) == "198.51.100.4"


def test_plain_addresses_are_written_one_way():
    assert plain_address("::ffff:127.0.0.1") == "127.0.0.1"
    assert plain_address("2001:DB8::0:1") == "2001:db8::1"
    assert plain_address("fe80::1%eth0") == "fe80::1"
    assert plain_address("/run/cotrain.sock") == "/run/cotrain.sock"
