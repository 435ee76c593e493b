"""Server errors print as one line `error: <CODE> <reason>: <message>` and exit 1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from gantry.cli.main import main


def rich_status(code: int, message: str, reason: str | None) -> status_pb2.Status:
    details = []
    if reason is not None:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="gantry.dev"))
        details.append(detail)
    return status_pb2.Status(code=code, message=message, details=details)


async def serve_failing(status: status_pb2.Status) -> tuple[grpc.aio.Server, str]:
    grpc_status = rpc_status.to_status(status)

    async def fail(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        await context.abort(
            grpc_status.code, grpc_status.details, trailing_metadata=grpc_status.trailing_metadata
        )
        raise AssertionError("abort returns never")

    class AnyMethod(grpc.GenericRpcHandler):
        def service(
            self, handler_call_details: grpc.HandlerCallDetails
        ) -> grpc.RpcMethodHandler[bytes, bytes]:
            return grpc.unary_unary_rpc_method_handler(fail)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((AnyMethod(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    (tmp_path / "operator.token").write_text("gop_test_secret\n")
    (tmp_path / "client.key").write_text("gak_test_secret\n")
    return tmp_path


@pytest.fixture
async def not_found_server() -> AsyncIterator[str]:
    status = rich_status(code_pb2.NOT_FOUND, "deployment 'd-1' not found\n(really)", "NOT_FOUND")
    server, address = await serve_failing(status)
    yield address
    await server.stop(None)


async def run_cli(*argv: str) -> int:
    # The CLI blocks on its call: run it off the loop that serves the fake server.
    return await asyncio.to_thread(main, list(argv))


async def test_rich_status_prints_code_reason_once_and_message_on_one_line(
    not_found_server: str, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await run_cli(
        "--address", not_found_server, "--state-dir", str(state_dir), "unload", "d-1"
    )
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err == "error: NOT_FOUND: deployment 'd-1' not found (really)\n"
    assert captured.out == ""
    assert "Traceback" not in captured.err


async def test_inference_errors_print_the_same_way(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = rich_status(code_pb2.UNAVAILABLE, "no resident deployment", "DEPLOYMENT_NOT_READY")
    server, address = await serve_failing(status)
    try:
        code = await run_cli("embed", "hello", "--address", address, "--state-dir", str(state_dir))
    finally:
        await server.stop(None)
    assert code == 1
    assert capsys.readouterr().err == (
        "error: UNAVAILABLE DEPLOYMENT_NOT_READY: no resident deployment\n"
    )


async def test_a_plain_status_prints_without_a_reason(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, address = await serve_failing(
        rich_status(code_pb2.PERMISSION_DENIED, "operators only", None)
    )
    try:
        code = await run_cli("--address", address, "--state-dir", str(state_dir), "nodes")
    finally:
        await server.stop(None)
    assert code == 1
    assert capsys.readouterr().err == "error: PERMISSION_DENIED: operators only\n"


def test_nothing_listening_says_to_start_gantry(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--address", "127.0.0.1:1", "--state-dir", str(state_dir), "deployments"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("error: UNAVAILABLE: ")
    assert err.endswith("(is `gantry up` running at 127.0.0.1:1?)\n")


def test_a_missing_token_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--state-dir", str(tmp_path / "none"), "nodes"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no operator token at ")
    assert "gantry up" in err
