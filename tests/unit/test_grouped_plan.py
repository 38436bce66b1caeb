"""The plan of a grouped round (engine/planning/groups.py): groups of near-equal size and
strength, few links per member, and slot sizes the LP picks."""

import random

import pytest

from engine.planning.groups import carried_groups, form_groups, grouped_round_time, plan_groups
from engine.planning.load_balancing import Member, balance
from engine.planning.slot_reducers import exchanges_with

MB = 1e6


def home_links(n: int, seed: int = 0) -> list[Member]:
    """Down/up Mbit/s of home links (the collaboration bench's four), in bytes per second."""
    rng = random.Random(seed)
    return [Member(up * 1e6 / 8, down * 1e6 / 8)
            for down, up in (rng.choice([(300, 60), (100, 20), (50, 10), (20, 5)]) for _ in range(n))]


def test_twelve_equal_members_in_groups_of_four_link_to_five_others_and_move_the_loads_worked_out():
    members = [Member(10 * MB, 10 * MB)] * 12
    plan = plan_groups(members, 4, 100 * MB)
    assert sorted(map(len, plan.groups)) == [4, 4, 4]
    assert sorted(i for g in plan.groups for i in g) == list(range(12))
    assert plan.slot_shares == pytest.approx([0.25] * 4)
    assert plan.links() == [3 + 2] * 12  # its group, and its slot's reducers in the 2 other groups
    # Each way: its 3 other slots out and back (0.75), 3 results of its slot out (0.75),
    # its partial sum's 2 other pieces out and back and the 2 others' pieces of its own in
    # (1/4 * (2/3 + 2 * 1/3)): 1 + 0.5 + 1/3 of the vector.
    assert plan.seconds == pytest.approx((0.75 + 0.75 + 1 / 3) * 100 * MB / (10 * MB), rel=1e-6)


def test_one_group_is_the_flat_round():
    members = [*home_links(9, seed=3), Member(2 * MB, 2 * MB, reduces=False)]
    grouped = plan_groups(members, 16, 100 * MB)
    assert len(grouped.groups) == 1
    assert grouped.seconds == pytest.approx(balance(members, 100 * MB).seconds, rel=1e-4)


def test_members_that_may_not_reduce_never_take_a_slot_and_each_group_gets_its_share_of_the_fast():
    members = [Member(60e6, 300e6)] * 4 + [Member(5e6, 20e6)] * 8 + [Member(50e6, 50e6, reduces=False)] * 4
    groups = form_groups(members, 4)
    assert [sum(i < 4 for i in g) for g in groups] == [1, 1, 1, 1]  # one fast member each
    assert [sum(i >= 12 for i in g) for g in groups] == [1, 1, 1, 1]  # one client each
    plan = plan_groups(members, 4, 100 * MB)
    assert all(i < 12 for reducers in plan.reducers for i in reducers)
    assert all(reducers[0] < 4 for reducers in plan.reducers)  # slot 0: each group's fastest
    assert plan.seconds == pytest.approx(grouped_round_time(plan, members, 100 * MB))


def test_a_thousand_home_links_link_to_dozens_not_hundreds():
    members = home_links(1000)
    plan = plan_groups(members, 32, 100 * MB)
    assert len(plan.groups) == 32 and max(plan.links()) <= 31 + 31
    assert sum(plan.slot_shares) == pytest.approx(1.0)
    assert all(sum(p) == pytest.approx(1.0) for p in plan.pieces)
    # The two-level round moves a few slots' worth more than the flat one, on the fast
    # links; on home links both wait for the slowest uploader to send its vector once.
    slowest = min(m.upload for m in members)
    assert plan.seconds == pytest.approx(balance(members, 100 * MB).seconds)
    assert plan.seconds == pytest.approx(100 * MB / slowest)


@pytest.mark.parametrize("members, size, message", [
    ([Member(1e6, 1e6, reduces=False)] * 4, 2, "no member that may reduce"),
    ([Member(1e6, 1e6)] * 4, 1, "at least 2 members"),
])
def test_plans_that_cannot_be_are_refused(members, size, message):
    with pytest.raises(ValueError, match=message):
        plan_groups(members, size, MB)


def test_members_keep_last_rounds_groups_unless_new_ones_end_the_round_a_fifth_sooner():
    members = [Member(10 * MB, 10 * MB)] * 12
    last = plan_groups(members, 4, 100 * MB)
    kept = (last.groups, last.reducers)
    # One member measures a somewhat faster link: new groups would gain little, so the
    # links stay as they are.
    faster = [Member(14 * MB, 14 * MB), *members[1:]]
    again = plan_groups(faster, 4, 100 * MB, kept)
    assert (again.groups, again.reducers) == kept
    assert again.seconds <= last.seconds
    # Three members turn out to have links three times as fast, all in one group (the
    # first grouping knew nothing of them): new groups spread them, and the round ends in
    # 0.7 of the time the old groups would take.
    fast = set(last.groups[0][:3])
    measured = [Member(30 * MB, 30 * MB) if i in fast else m for i, m in enumerate(members)]
    regrouped = plan_groups(measured, 4, 100 * MB, kept)
    assert all(len(fast & set(g)) == 1 for g in regrouped.groups)
    as_it_was = plan_groups(measured, 4, 100 * MB, kept, regroup_gain=0.0)
    assert (as_it_was.groups, as_it_was.reducers) == kept
    assert regrouped.seconds < 0.8 * as_it_was.seconds


def test_when_members_come_and_go_the_others_keep_their_groups_and_slots():
    members = [Member(10 * MB, 10 * MB)] * 12
    last = plan_groups(members, 4, 100 * MB)
    # Member 11 leaves (the caller drops it from the last round's groups), and two others
    # come (indices 11 and 12): they join the groups left smallest.
    stayed = ([[i for i in g if i != 11] for g in last.groups],
              [[i for i in r if i != 11] for r in last.reducers])
    now = [*members[:11], Member(10 * MB, 10 * MB), Member(10 * MB, 10 * MB)]
    plan = plan_groups(now, 4, 100 * MB, stayed)
    for before, after in zip(stayed[0], plan.groups, strict=True):
        assert after[:len(before)] == before  # nobody moved
    assert sorted(i for g in plan.groups for i in g) == list(range(13))
    assert sorted(map(len, plan.groups)) == [4, 4, 5]
    # Slot reducers that stayed keep their slots (a group that lost its reducer of slot k
    # gives slot k to another member; the pairs across groups of the other slots hold).
    for before, after in zip(stayed[1], plan.reducers, strict=True):
        assert [i for i in after if i in before] == before
    # A group left with one member is dealt out into the others.
    few = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10]]
    groups = carried_groups([Member(10 * MB, 10 * MB)] * 11, 4, few)
    assert groups is not None and len(groups) == 2 and groups[0][:5] == few[0] and groups[1][:5] == few[1]
    # A group dealt out into the only other one leaves one group: a flat round, planned afresh
    # (e, f and g of [a..d], [e..h] left; h and a newcomer join the first group).
    assert carried_groups([Member(10 * MB, 10 * MB)] * 6, 4, [[0, 1, 2, 3], [4]]) is None
    six = [Member(10 * MB, 10 * MB)] * 6
    assert len(plan_groups(six, 4, 100 * MB, ([[0, 1, 2, 3], [4]], [[0], [4]])).groups) == 2
    # One grown past one and a half times the group size splits in two.
    grown = carried_groups([Member(10 * MB, 10 * MB)] * 7, 4, [[0, 1, 2, 3, 4, 5]])
    assert grown is not None and sorted(map(len, grown)) == [3, 4]


def test_whom_a_member_exchanges_with_is_its_group_and_its_slots_reducers_and_it_is_mutual():
    plan = plan_groups(home_links(12), 4, 1.0)
    groups = [[f"p{i}" for i in g] for g in plan.groups]
    reducers = [[f"p{i}" for i in r] for r in plan.reducers]
    everyone = [p for g in groups for p in g]
    partners = {p: exchanges_with(groups, reducers, p) for p in everyone}
    for p, others in partners.items():
        assert all(p in partners[q] for q in others), p
        assert len(others) == plan.links()[int(p[1:])]
    assert exchanges_with(groups, reducers, "stranger") == set()
