"""tests/bench/smaps.py: a host's /proc/<pid>/smaps summed by kind of mapping."""

from __future__ import annotations

from tests.bench import smaps

# Abridged from a forked model host's smaps: the header line of each mapping, then its sizes.
HOST_SMAPS = """\
5575a6657000-5575af98f000 rw-p 00000000 00:00 0                          [heap]
Size:             152544 kB
Rss:              152000 kB
Pss:               60000 kB
Shared_Clean:          0 kB
Shared_Dirty:     140000 kB
Private_Clean:         0 kB
Private_Dirty:     12000 kB
VmFlags: rd wr mr mw me ac
7fc5e7359000-7fc5e7a6a000 rw-p 00000000 00:00 0
Size:               7236 kB
Rss:                7032 kB
Pss:                7032 kB
Private_Dirty:      7032 kB
7fc5f0000000-7fc5f5000000 r--s 00000000 08:01 123  /models/minilm/model.safetensors
Size:              88740 kB
Rss:               42800 kB
Pss:               21400 kB
Shared_Clean:      42800 kB
7fc600000000-7fc601000000 r-xp 00000000 08:01 456  /venv/site-packages/torch/lib/libtorch_cpu.so
Size:              16384 kB
Rss:                9000 kB
Pss:                3000 kB
Shared_Clean:       9000 kB
7fc610000000-7fc610100000 r-xp 00000000 08:01 789  /usr/lib/x86_64-linux-gnu/libc.so.6
Size:               1024 kB
Rss:                1000 kB
Pss:                 100 kB
Shared_Clean:       1000 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Size:                132 kB
Rss:                 100 kB
Pss:                 100 kB
Private_Dirty:       100 kB
"""

SERVER_START_OF_HEAP = 0x5575A6657000


def test_each_mapping_is_summed_under_its_kind() -> None:
    usage = smaps.breakdown(HOST_SMAPS, frozenset({SERVER_START_OF_HEAP}))

    assert usage[smaps.INHERITED_ANONYMOUS].pss == 60000
    assert usage[smaps.INHERITED_ANONYMOUS].private == 12000
    assert usage[smaps.INHERITED_ANONYMOUS].shared == 140000
    # Not in the server's map: allocated by the host after the fork.
    assert usage[smaps.OWN_ANONYMOUS].pss == 7032
    assert usage[smaps.WEIGHTS].rss == 42800
    assert usage[smaps.WEIGHTS].pss == 21400
    assert usage[smaps.TORCH_LIBRARIES].pss == 3000
    assert usage[smaps.OTHER_LIBRARIES].pss == 100
    assert usage[smaps.STACKS].pss == 100
    assert sum(u.pss for u in usage.values()) == 60000 + 7032 + 21400 + 3000 + 100 + 100


def test_without_the_servers_map_all_anonymous_memory_counts_as_inherited() -> None:
    usage = smaps.breakdown(HOST_SMAPS)

    assert usage[smaps.INHERITED_ANONYMOUS].pss == 60000 + 7032
    assert usage[smaps.OWN_ANONYMOUS].rss == 0


def test_the_start_addresses_are_those_of_the_header_lines() -> None:
    assert SERVER_START_OF_HEAP in smaps.starts(HOST_SMAPS)
    assert len(smaps.starts(HOST_SMAPS)) == 6


def test_the_report_ends_with_the_total_and_what_is_the_hosts_alone() -> None:
    lines = list(smaps.report_lines(smaps.breakdown(HOST_SMAPS)))

    assert lines[-1].startswith("total")
    assert f"{(60000 + 7032 + 21400 + 3000 + 200) / 1024:6.1f} MiB" in lines[-1]
    assert f"of which {(12000 + 7032 + 100) / 1024:.1f} MiB are its alone" in lines[-1]
    # A kind the process does not map is left out.
    assert not any(line.startswith(smaps.OTHER_FILES) for line in lines)
