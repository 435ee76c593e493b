"""Generate docs/api/*.md from proto/gantry/v1/*.proto: services, RPCs, messages, enums.

    .venv/bin/python scripts/gen_api_docs.py [OUT_DIR]      (default docs/api; `make docs`)

protoc (grpc_tools) compiles the protos into a FileDescriptorSet with source info, so the pages
carry the comments written in the .proto files: a proto change plus `make docs` is the whole
update, and tests/unit/test_api_docs.py fails while the committed pages differ from it.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from google.protobuf import descriptor_pb2

REPO = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO / "proto"
PROTO_DIR = PROTO_ROOT / "gantry" / "v1"
DEFAULT_OUT = REPO / "docs" / "api"
PACKAGE = "gantry.v1"

# FileDescriptorProto / DescriptorProto field numbers, as source-info paths use them.
FILE_MESSAGE, FILE_ENUM, FILE_SERVICE = 4, 5, 6
MESSAGE_FIELD, MESSAGE_NESTED, MESSAGE_ENUM = 2, 3, 4
SERVICE_METHOD = 2
ENUM_VALUE = 2

FDP = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in FDP.Type.items()
    if name not in ("TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP")
}

Comments = dict[tuple[int, ...], str]


def compile_protos(files: list[Path]) -> descriptor_pb2.FileDescriptorSet:
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        argv = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *(str(f.relative_to(PROTO_ROOT)) for f in files),
        ]
        if protoc.main(argv) != 0:
            raise SystemExit("protoc failed")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def comments_of(file: descriptor_pb2.FileDescriptorProto) -> Comments:
    found: Comments = {}
    for location in file.source_code_info.location:
        text = location.leading_comments or location.trailing_comments
        if text.strip():
            lines = [line.removeprefix(" ").rstrip() for line in text.strip("\n").splitlines()]
            found[tuple(location.path)] = " ".join(line for line in lines if line)
    return found


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def short(type_name: str) -> str:
    name = type_name.lstrip(".")
    return name.removeprefix(PACKAGE + ".")


def link(type_name: str, where: dict[str, str], page: str) -> str:
    """A link to the type's section, on this page or on the page of the file defining it."""
    name = short(type_name)
    defined_in = where.get(type_name.lstrip("."))
    if defined_in is None:
        return f"`{name}`"
    target = "" if defined_in == page else defined_in
    return f"[`{name}`]({target}#{anchor(name)})"


def anchor(name: str) -> str:
    return name.lower().replace(".", "")


def field_type(
    field: descriptor_pb2.FieldDescriptorProto,
    maps: dict[str, descriptor_pb2.DescriptorProto],
    where: dict[str, str],
    page: str,
) -> str:
    if field.type_name.lstrip(".") in maps:
        entry = maps[field.type_name.lstrip(".")]
        key = field_type(entry.field[0], maps, where, page)
        value = field_type(entry.field[1], maps, where, page)
        return f"map<{key}, {value}>"
    if field.type_name:
        base = link(field.type_name, where, page)
    else:
        base = f"`{SCALARS[field.type]}`"
    if field.label == FDP.LABEL_REPEATED:
        return f"repeated {base}"
    if field.proto3_optional:
        return f"optional {base}"
    return base


def walk_messages(
    messages: list[descriptor_pb2.DescriptorProto], prefix: str, path: tuple[int, ...]
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto, tuple[int, ...]]]:
    for index, message in enumerate(messages):
        name = f"{prefix}{message.name}"
        here = (*path, index)
        yield name, message, here
        yield from walk_messages(list(message.nested_type), f"{name}.", (*here, MESSAGE_NESTED))


def walk_enums(
    file: descriptor_pb2.FileDescriptorProto,
) -> Iterator[tuple[str, descriptor_pb2.EnumDescriptorProto, tuple[int, ...]]]:
    for index, enum in enumerate(file.enum_type):
        yield enum.name, enum, (FILE_ENUM, index)
    for name, message, path in walk_messages(list(file.message_type), "", (FILE_MESSAGE,)):
        for index, enum in enumerate(message.enum_type):
            yield f"{name}.{enum.name}", enum, (*path, MESSAGE_ENUM, index)


def render(file: descriptor_pb2.FileDescriptorProto, where: dict[str, str]) -> str:
    page = page_name(file)
    comments = comments_of(file)
    messages = list(walk_messages(list(file.message_type), "", (FILE_MESSAGE,)))
    maps = {
        f"{file.package}.{name}": message
        for name, message, _ in messages
        if message.options.map_entry
    }
    out = [
        f"# `{file.name}`",
        "",
        "Generated by `scripts/gen_api_docs.py` from the proto file (`make docs`); do not edit.",
        "",
    ]
    if file.dependency:
        deps = ", ".join(f"`{d}`" for d in file.dependency)
        out += [f"Imports: {deps}.", ""]
    for s_index, service in enumerate(file.service):
        out += [f"## Service `{file.package}.{service.name}`", ""]
        if text := comments.get((FILE_SERVICE, s_index)):
            out += [text, ""]
        out += ["| RPC | Request | Response | Description |", "|---|---|---|---|"]
        for m_index, method in enumerate(service.method):
            request = link(method.input_type, where, page)
            response = link(method.output_type, where, page)
            request = ("stream " if method.client_streaming else "") + request
            response = ("stream " if method.server_streaming else "") + response
            text = comments.get((FILE_SERVICE, s_index, SERVICE_METHOD, m_index), "")
            out.append(f"| `{method.name}` | {request} | {response} | {cell(text)} |")
        out.append("")
    shown = [(n, m, p) for n, m, p in messages if not m.options.map_entry]
    if shown:
        out += ["## Messages", ""]
    for name, message, path in shown:
        out += [f"### {name}", ""]
        if text := comments.get(path):
            out += [text, ""]
        if not message.field:
            out += ["No fields.", ""]
            continue
        out += ["| Field | Number | Type | Description |", "|---|---|---|---|"]
        for f_index, field in enumerate(message.field):
            text = comments.get((*path, MESSAGE_FIELD, f_index), "")
            if field.HasField("oneof_index") and not field.proto3_optional:
                oneof = message.oneof_decl[field.oneof_index].name
                text = f"(oneof `{oneof}`) {text}".rstrip()
            kind = field_type(field, maps, where, page)
            out.append(f"| `{field.name}` | {field.number} | {kind} | {cell(text)} |")
        out.append("")
    enums = list(walk_enums(file))
    if enums:
        out += ["## Enums", ""]
    for name, enum, path in enums:
        out += [f"### {name}", ""]
        if text := comments.get(path):
            out += [text, ""]
        out += ["| Value | Number | Description |", "|---|---|---|"]
        for v_index, value in enumerate(enum.value):
            text = comments.get((*path, ENUM_VALUE, v_index), "")
            out.append(f"| `{value.name}` | {value.number} | {cell(text)} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def page_name(file: descriptor_pb2.FileDescriptorProto) -> str:
    return Path(file.name).stem + ".md"


def index(files: list[descriptor_pb2.FileDescriptorProto]) -> str:
    out = [
        "# API reference",
        "",
        "Generated by `scripts/gen_api_docs.py` from `proto/gantry/v1/` (`make docs`); do not",
        "edit.",
        "Every failure is a gRPC status with one `google.rpc.ErrorInfo` (domain `gantry.dev`): the",
        "reasons are in [../errors.md](../errors.md), the bounds in [../limits.md](../limits.md).",
        "",
        "| Proto file | Services |",
        "|---|---|",
    ]
    for file in files:
        services = ", ".join(f"`{s.name}`" for s in file.service) or "(messages only)"
        out.append(f"| [{file.name}]({page_name(file)}) | {services} |")
    return "\n".join(out) + "\n"


def generate(out_dir: Path) -> list[Path]:
    """Write every page into out_dir; returns the paths written (stale pages are removed)."""
    protos = sorted(PROTO_DIR.glob("*.proto"))
    descriptor_set = compile_protos(protos)
    ours = [f for f in descriptor_set.file if f.package == PACKAGE]
    out_dir.mkdir(parents=True, exist_ok=True)
    where = {
        f"{f.package}.{name}": page_name(f)
        for f in ours
        for name in [n for n, _, _ in walk_messages(list(f.message_type), "", ())]
        + [n for n, _, _ in walk_enums(f)]
    }
    pages = {"README.md": index(ours)} | {page_name(f): render(f, where) for f in ours}
    for stale in out_dir.glob("*.md"):
        if stale.name not in pages:
            stale.unlink()
    written = []
    for name, text in pages.items():
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    out_dir = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    for path in generate(out_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
