"""The committed gRPC stubs are what grpcio-tools makes of the committed .proto: regenerated
into a temp dir, every file must be byte-identical (`make proto` rewrites them)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROTO = Path("context_app/rpc/v1/context.proto")
GENERATED = ("context_pb2.py", "context_pb2.pyi", "context_pb2_grpc.py")


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (dev dependency)")
    (tmp_path / PROTO.parent).mkdir(parents=True)
    shutil.copy(ROOT / PROTO, tmp_path / PROTO)
    args = [
        "protoc",
        f"-I{tmp_path}",
        f"-I{Path(protoc.__file__).parent / '_proto'}",  # google/protobuf/*.proto
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        str(tmp_path / PROTO),
    ]
    assert protoc.main(args) == 0, "protoc failed on the committed .proto"
    stale = [
        name
        for name in GENERATED
        if (tmp_path / PROTO.parent / name).read_bytes()
        != (ROOT / PROTO.parent / name).read_bytes()
    ]
    assert not stale, f"{stale} differ from the .proto: run `make proto` and commit them"


def test_the_service_is_versioned_and_complete() -> None:
    from context_app.rpc.v1 import context_pb2

    service = context_pb2.DESCRIPTOR.services_by_name["ContextService"]
    assert service.full_name == "context.v1.ContextService"
    methods = {m.name: m for m in service.methods}
    assert set(methods) == {
        "CreateSession",
        "GetState",
        "PostEvent",
        "GetContext",
        "StreamContext",
        "PostOutput",
        "CloseSession",
    }
    assert methods["StreamContext"].server_streaming  # delta recall
    assert not any(m.server_streaming for n, m in methods.items() if n != "StreamContext")
