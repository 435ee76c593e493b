"""What a process's memory is, by mapping: /proc/<pid>/smaps summed into a few kinds.

Pure: `breakdown` takes the text of a host's smaps (and, optionally, the set of mapping start
addresses its fork server has), so the bench can say what a forked host's PSS is made of: the
libraries (shared with the server and the other hosts, so each pays a share), the model's weight
files (shared clean page cache when mapped), the server's anonymous memory the host dirtied after
the fork (copy-on-write copies: Python objects whose reference counts or GC headers changed), and
what the host allocated itself (malloc arenas, thread stacks, tensors, the tokenizer).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")

# The kinds, in the order a report lists them.
WEIGHTS = "model weight files"
TORCH_LIBRARIES = "torch's libraries"
OTHER_LIBRARIES = "other libraries and the interpreter"
INHERITED_ANONYMOUS = "server's anonymous memory (heap, arenas)"
OWN_ANONYMOUS = "anonymous memory mapped after the fork"
STACKS = "main stack"
OTHER_FILES = "other files"
KINDS = (
    WEIGHTS,
    TORCH_LIBRARIES,
    OTHER_LIBRARIES,
    INHERITED_ANONYMOUS,
    OWN_ANONYMOUS,
    STACKS,
    OTHER_FILES,
)


@dataclass(frozen=True)
class Mapping:
    start: int
    path: str
    kib: dict[str, int] = field(default_factory=dict)


@dataclass
class Usage:
    """kB (KiB) of one kind: resident, proportional, mapped by this process alone (what it adds
    to the machine's memory, most of it pages copied or written after the fork), and shared."""

    rss: int = 0
    pss: int = 0
    private: int = 0
    shared: int = 0

    def add(self, mapping: Mapping) -> None:
        self.rss += mapping.kib.get("Rss", 0)
        self.pss += mapping.kib.get("Pss", 0)
        self.private += mapping.kib.get("Private_Clean", 0) + mapping.kib.get("Private_Dirty", 0)
        self.shared += mapping.kib.get("Shared_Clean", 0) + mapping.kib.get("Shared_Dirty", 0)


def parse(text: str) -> Iterator[Mapping]:
    """The mappings of one smaps file: a header line (range perms offset dev inode [path]), then
    `Key: value kB` lines."""
    current: Mapping | None = None
    for line in text.splitlines():
        head = line.split(maxsplit=5)
        if head and "-" in head[0] and not head[0].endswith(":"):
            if current is not None:
                yield current
            path = head[5].strip() if len(head) == 6 else ""
            current = Mapping(start=int(head[0].split("-")[0], 16), path=path)
        elif current is not None and line.endswith(" kB"):
            key, _, rest = line.partition(":")
            current.kib[key] = int(rest.split()[0])
    if current is not None:
        yield current


def kind_of(mapping: Mapping, server_starts: frozenset[int] | None) -> str:
    path = mapping.path.removesuffix(" (deleted)")
    if path.endswith(WEIGHT_SUFFIXES):
        return WEIGHTS
    if "/torch/lib/" in path:
        return TORCH_LIBRARIES
    if ".so" in path.rsplit("/", 1)[-1] or "/bin/python" in path:
        return OTHER_LIBRARIES
    if path == "[stack]":
        return STACKS
    if path in ("", "[heap]") or path.startswith("[anon"):
        if server_starts is None or mapping.start in server_starts:
            return INHERITED_ANONYMOUS
        return OWN_ANONYMOUS
    return OTHER_FILES


def breakdown(text: str, server_starts: frozenset[int] | None = None) -> dict[str, Usage]:
    """kB by kind; `server_starts` (the start addresses of the server's mappings) tells the
    anonymous memory the host inherited from what it mapped after the fork."""
    usage = {kind: Usage() for kind in KINDS}
    for mapping in parse(text):
        usage[kind_of(mapping, server_starts)].add(mapping)
    return usage


def starts(text: str) -> frozenset[int]:
    return frozenset(mapping.start for mapping in parse(text))


def report_lines(usage: dict[str, Usage]) -> Iterable[str]:
    for kind in KINDS:
        u = usage[kind]
        if u.rss:
            yield (
                f"{kind:<42} PSS {u.pss / 1024:6.1f} MiB  RSS {u.rss / 1024:6.1f}  "
                f"private {u.private / 1024:6.1f}  shared {u.shared / 1024:6.1f}"
            )
    pss = sum(u.pss for u in usage.values()) / 1024
    private = sum(u.private for u in usage.values()) / 1024
    yield f"{'total':<42} PSS {pss:6.1f} MiB, of which {private:.1f} MiB are its alone"
