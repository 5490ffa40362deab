"""When a dropped host may rejoin an elastic job (launcher/membership.py):
the cool-down of a host that flaps and the cap on changes per hour, against
hand-computed times."""

import pytest

from resnet_keras.launcher import membership

ALL = ['h1', 'h2', 'h3']


@pytest.mark.parametrize('drops, seconds', [(0, 0), (1, 0), (2, 10), (3, 20),
                                            (4, 40), (5, 80), (6, 100),
                                            (9, 100)])
def test_the_cooldown_doubles_from_the_second_drop_up_to_100_s(drops,
                                                               seconds):
  assert membership.cooldown(drops) == seconds


def test_a_host_dropped_once_may_rejoin_at_once_and_a_flapping_one_waits():
  hosts = membership.Membership(max_changes_per_hour=100)
  hosts.changed(ALL, ['h1', 'h2'], now=1000.0)
  assert hosts.may_rejoin('h3', 1000.0)
  hosts.changed(['h1', 'h2'], ALL, now=1005.0)
  hosts.changed(ALL, ['h1', 'h2'], now=1050.0)  # The second drop: 10 s.
  assert not hosts.may_rejoin('h3', 1059.9)
  assert hosts.may_rejoin('h3', 1060.0)
  hosts.changed(['h1', 'h2'], ALL, now=1061.0)
  hosts.changed(ALL, ['h1', 'h2'], now=1100.0)  # The third: 20 s.
  assert not hosts.may_rejoin('h3', 1119.0)
  assert hosts.may_rejoin('h3', 1120.0)
  # Another host's drops are its own.
  hosts.changed(['h1', 'h2'], ['h1'], now=1100.0)
  assert hosts.may_rejoin('h2', 1100.0)


def test_no_host_rejoins_once_the_hour_holds_the_cap_of_changes():
  hosts = membership.Membership(max_changes_per_hour=3)
  hosts.changed(ALL, ['h1', 'h3'], now=0.0)
  hosts.changed(['h1', 'h3'], ALL, now=100.0)
  hosts.changed(ALL, ['h1', 'h2'], now=200.0)  # The hour's third change.
  assert hosts.changes_in_last_hour(200.0) == 3
  assert not hosts.may_rejoin('h3', 300.0)
  # The first change leaves the hour at 3600 s: two left, one may come.
  assert hosts.changes_in_last_hour(3600.0) == 2
  assert hosts.may_rejoin('h3', 3600.0)


def test_a_layout_without_a_change_is_not_counted():
  hosts = membership.Membership(max_changes_per_hour=1)
  hosts.changed(ALL, list(reversed(ALL)), now=0.0)
  assert hosts.changes_in_last_hour(0.0) == 0
