"""The design docs name only what the code has.

docs/state-machines.md: each `## <machine>` section lists its states on a `States:` line and its
allowed moves in a `| From | To | ... |` table (the circuit breaker's: `| From | Event | To |`);
both must equal the code's tables, and every machine the code records must have its section.
Rows whose reason begins "operator only" must be exactly the edges no derived walk may take
(`EXPLICIT_ONLY`).

docs/contracts.md: every `package.Service` and `package.Service/Rpc` it names in backticks must be
a service, or an RPC of that service, in proto/ (so a renamed or removed RPC fails here), and every
service in proto/ must be named there.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from gantry.controlplane.evidence.pipeline_states import (
    ASSESSMENT_TRANSITIONS,
    AssessmentState,
    CandidateStatus,
)
from gantry.controlplane.evidence.probe_transitions import PROBE_TRANSITIONS, ProbeState
from gantry.controlplane.platform import state_machines as transitions
from gantry.scheduler.policy import breakers
from gantry.scheduler.policy.types import BreakerState

REPO = Path(__file__).resolve().parents[2]
STATE_MACHINES = REPO / "docs" / "state-machines.md"
CONTRACTS = REPO / "docs" / "contracts.md"
PROTOS = REPO / "proto"

NAME = re.compile(r"`([A-Z][A-Z_]*)`")


@dataclass(frozen=True)
class Section:
    title: str
    states: frozenset[str]
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]  # each cell as written


def _cells(line: str) -> tuple[str, ...]:
    return tuple(cell.strip() for cell in line.strip().strip("|").split("|"))


def _name(cell: str) -> str:
    found = NAME.fullmatch(cell.strip())
    assert found, f"a table cell that should be one `STATE` is {cell!r}"
    return found.group(1)


def parse_sections(text: str) -> dict[str, Section]:
    """`## Title` sections with their `States:` line and their From/To table."""
    sections: dict[str, Section] = {}
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    for title, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = body.splitlines()
        states_at = [i for i, line in enumerate(lines) if line.startswith("States:")]
        assert len(states_at) == 1, f"section {title!r}: want exactly one `States:` line"
        # The list may wrap onto the next lines, until a blank one.
        states_text = []
        for line in lines[states_at[0] :]:
            if not line.strip():
                break
            states_text.append(line)
        states = frozenset(NAME.findall(" ".join(states_text)))
        header: tuple[str, ...] = ()
        rows: list[tuple[str, ...]] = []
        for index, line in enumerate(lines):
            if line.startswith("| From |"):
                assert not header, f"section {title!r}: want at most one From table"
                header = _cells(line)
                for row in lines[index + 2 :]:
                    if not row.startswith("|"):
                        break
                    rows.append(_cells(row))
        sections[title.strip()] = Section(title.strip(), states, header, tuple(rows))
    return sections


# Section title -> (its states, its table of allowed moves); None: no transitions at all.
EDGE_MACHINES: Mapping[str, tuple[type[enum.Enum], Mapping[enum.Enum, frozenset[enum.Enum]]]] = {
    "Deployment": (transitions.DeploymentState, transitions.DEPLOYMENT_TRANSITIONS),
    "Residency": (transitions.ResidencyState, transitions.RESIDENCY_TRANSITIONS),
    "Serving job": (transitions.JobState, transitions.JOB_TRANSITIONS),
    "Node": (transitions.NodeState, transitions.NODE_TRANSITIONS),
    "Runtime probe": (ProbeState, PROBE_TRANSITIONS),
    "Compatibility assessment": (AssessmentState, ASSESSMENT_TRANSITIONS),
}
# transitions.MACHINES' names -> this page's sections.
RECORDED = {
    "deployment": "Deployment",
    "residency": "Residency",
    "job": "Serving job",
    "node": "Node",
}
STATES_ONLY: Mapping[str, type[enum.Enum]] = {"Deployment candidate": CandidateStatus}
BREAKER = "Circuit breaker"


def _sections() -> dict[str, Section]:
    return parse_sections(STATE_MACHINES.read_text())


def test_every_section_is_a_machine_the_code_has() -> None:
    assert set(_sections()) == {*EDGE_MACHINES, *STATES_ONLY, BREAKER}
    assert set(transitions.MACHINES) == set(RECORDED)


@pytest.mark.parametrize("title", sorted(EDGE_MACHINES))
def test_states_and_transitions_equal_the_code(title: str) -> None:
    section = _sections()[title]
    states, table = EDGE_MACHINES[title]
    assert section.states == {state.name for state in states}
    assert section.header[:2] == ("From", "To")
    listed = [(_name(row[0]), _name(row[1])) for row in section.rows]
    assert len(listed) == len(set(listed)), f"{title}: a transition is listed twice"
    expected = {(str(a), str(b)) for a, targets in table.items() for b in targets}
    assert set(listed) == expected
    if title in RECORDED.values():
        machine = next(name for name, section_title in RECORDED.items() if section_title == title)
        assert table is transitions.MACHINES[machine]


def test_operator_only_rows_are_the_explicit_only_edges() -> None:
    for machine, title in RECORDED.items():
        rows = _sections()[title].rows
        marked = {
            (_name(row[0]), _name(row[1])) for row in rows if row[2].startswith("operator only")
        }
        explicit = {(str(a), str(b)) for a, b in transitions.EXPLICIT_ONLY.get(machine, ())}
        assert marked == explicit, title


def test_states_only_sections() -> None:
    for title, states in STATES_ONLY.items():
        section = _sections()[title]
        assert section.states == {state.name for state in states}
        assert section.rows == ()


def test_breaker_table_equals_the_code() -> None:
    section = _sections()[BREAKER]
    assert section.states == {state.name for state in BreakerState}
    assert section.header == ("From", "Event", "To")
    listed = {(_name(a), _name(event)): _name(b) for a, event, b in section.rows}
    assert len(listed) == len(section.rows)
    assert listed == {
        (state.name, event.name): target.name
        for (state, event), target in breakers.TRANSITIONS.items()
    }


def test_the_parser_reads_a_table() -> None:
    text = (
        "# x\n\n## Thing\n\nStates: `A`,\n`B`.\n\n| From | To | When |\n|---|---|---|\n"
        "| `A` | `B` | operator only: now |\n\nAfter.\n"
    )
    (section,) = parse_sections(text).values()
    assert section.states == {"A", "B"}
    assert section.rows == (("`A`", "`B`", "operator only: now"),)


# ---- docs/contracts.md against proto/ ------------------------------------------------------------

SERVICE = re.compile(r"^service (\w+) \{(.*?)^\}", re.M | re.S)
RPC = re.compile(r"^\s*rpc (\w+)\(", re.M)
PACKAGE = re.compile(r"^package ([\w.]+);", re.M)
# A service named in prose: `gantry.v1.ControlPlane`, `inference.GRPCInferenceService/ModelInfer`.
NAMED = re.compile(r"`((?:gantry\.v1|inference|grpc\.health\.v1)\.[A-Z]\w*)(?:/(\w+))?`")
HEADING = re.compile(r"^### `([\w.]+)`\s*$")
RPC_NAME = re.compile(r"`([A-Z]\w*)`")
# Served beside Gantry's own, from grpcio-health-checking's proto (not in proto/).
EXTERNAL = {"grpc.health.v1.Health": {"Check", "Watch"}}


def proto_services() -> dict[str, set[str]]:
    """`package.Service` -> its RPC names, from every .proto under proto/."""
    services: dict[str, set[str]] = {}
    for path in sorted(PROTOS.rglob("*.proto")):
        text = path.read_text()
        package = PACKAGE.search(text)
        assert package, path
        for name, body in SERVICE.findall(text):
            services[f"{package.group(1)}.{name}"] = set(RPC.findall(body))
    return services


def contract_tables(text: str) -> dict[str, list[str]]:
    """Each "### `package.Service`" section -> the RPC names in the first column of its tables
    whose header's first cell is `RPC` (a cell may name several: `GetNode`, `ListNodes`)."""
    tables: dict[str, list[str]] = {}
    service = ""
    in_rpc_table = False
    for line in text.splitlines():
        if line.startswith("#"):
            heading = HEADING.match(line)
            service = heading.group(1) if heading else ""
            if service:
                tables.setdefault(service, [])
            in_rpc_table = False
            continue
        if not line.startswith("|"):
            in_rpc_table = False
            continue
        first = _cells(line)[0]
        if first == "RPC":
            in_rpc_table = True
        elif in_rpc_table and service and not first.startswith("---"):
            tables[service].extend(RPC_NAME.findall(first))
    return tables


def _contracts() -> str:
    return CONTRACTS.read_text()


def test_contract_sections_list_only_rpcs_of_their_service() -> None:
    services = {**proto_services(), **EXTERNAL}
    tables = contract_tables(_contracts())
    assert set(tables) <= set(services), "a section names a service that is not in proto/"
    unknown = sorted(
        f"{service}/{rpc}"
        for service, rpcs in tables.items()
        for rpc in rpcs
        if rpc not in services[service]
    )
    assert unknown == []


def test_contract_sections_cover_every_service_and_rpc() -> None:
    tables = contract_tables(_contracts())
    assert set(proto_services()) <= set(tables)
    missing = sorted(
        f"{service}/{rpc}"
        for service, rpcs in proto_services().items()
        for rpc in rpcs
        if rpc not in tables[service]
    )
    assert missing == []


def test_services_named_in_prose_exist() -> None:
    services = {**proto_services(), **EXTERNAL}
    unknown = sorted(
        f"{service}/{rpc}" if rpc else service
        for service, rpc in NAMED.findall(_contracts())
        if service not in services or (rpc and rpc not in services[service])
    )
    assert unknown == []


def test_the_contract_readers_read() -> None:
    services = proto_services()
    assert {"Embed", "GenerateStream"} <= services["gantry.v1.Inference"]
    assert services["gantry.v1.WorkerGateway"] == {"Connect"}
    assert "ModelInfer" in services["inference.GRPCInferenceService"]
    text = (
        "### `gantry.v1.X`\n\n| RPC | What |\n|---|---|\n| `A`, `B` | `NOT_AN_RPC` in prose |\n\n"
        "| Service | Token |\n|---|---|\n| `C` | no |\n\n## Other\n\n| RPC |\n|---|\n| `D` |\n"
    )
    assert contract_tables(text) == {"gantry.v1.X": ["A", "B"]}
