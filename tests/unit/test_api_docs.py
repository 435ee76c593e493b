"""docs/api/ is what scripts/gen_api_docs.py makes from the protos today: regenerate and compare."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "docs" / "api"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_api_docs", REPO / "scripts/gen_api_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_committed_api_docs_match_the_protos(tmp_path: Path) -> None:
    _generator().generate(tmp_path)
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*.md")}
    committed = {p.name: p.read_text() for p in COMMITTED.glob("*.md")}
    assert sorted(committed) == sorted(fresh), "docs/api is out of date: run make docs"
    stale = sorted(name for name in fresh if fresh[name] != committed[name])
    assert stale == [], f"docs/api/{stale} differ from the protos: run make docs"


def test_pages_carry_every_rpc_with_its_comment(tmp_path: Path) -> None:
    """The generator reads source info: a leading comment in the proto reaches the page."""
    _generator().generate(tmp_path)
    page = (tmp_path / "inference.md").read_text()
    assert "## Service `gantry.v1.Inference`" in page
    assert "| `Rerank` | [`RerankRequest`](#rerankrequest) |" in page
    assert "A cross-encoder deployment scores each document against the query." in page
    assert "[`Priority`](common.md#priority)" in page
    control = (tmp_path / "control_plane.md").read_text()
    for rpc in ("RegisterNode", "CreateDeployment", "DeleteDeployment", "ListStateTransitions"):
        assert f"| `{rpc}` |" in control


def test_a_changed_proto_comment_changes_the_page(tmp_path: Path, monkeypatch) -> None:
    """The comparison above can fail: a proto with another comment renders another page."""
    generator = _generator()
    protos = tmp_path / "proto" / "gantry" / "v1"
    protos.mkdir(parents=True)
    for proto in (REPO / "proto" / "gantry" / "v1").glob("*.proto"):
        text = proto.read_text()
        if proto.name == "inference.proto":
            text = text.replace(
                "A cross-encoder deployment scores", "A changed comment: it scores", 1
            )
        (protos / proto.name).write_text(text)
    monkeypatch.setattr(generator, "PROTO_ROOT", tmp_path / "proto")
    monkeypatch.setattr(generator, "PROTO_DIR", protos)
    out = tmp_path / "out"
    generator.generate(out)
    assert "A changed comment: it scores" in (out / "inference.md").read_text()
    assert (out / "inference.md").read_text() != (COMMITTED / "inference.md").read_text()
