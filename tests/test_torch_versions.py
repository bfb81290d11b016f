"""What the package does on a torch older than the course's 2.13 (issue 40 item 5; the GPU
machine has torch 2.11): the paths each torch takes, checked on this one. The paths an older
torch takes are reached by hiding the newer API (monkeypatch), as tests/test_one_gpu*.py do."""

from __future__ import annotations

import inspect
import os
import socket
import warnings

import pytest
import torch
from torch import nn

import ddp_lab as dl
from ddp_lab.tools import train_process


def _buckets(rank: int) -> tuple[list[int], list[int], int]:
    """DDP's bucket sizes under ``fixed_buckets``: at construction and after the rebuild."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_lab.tools.train import SmallCNN

    torch.manual_seed(0)
    model = DDP(SmallCNN(), **train_process.fixed_buckets())
    built = model._get_ddp_logging_data()["bucket_sizes"]
    for _ in range(3):  # the rebuild happens in forward 2, the logger sees it in forward 3
        model(torch.randn(2, 1, 8, 8)).sum().backward()
    data = model._get_ddp_logging_data()
    return (
        built,
        data.get("rebuilt_bucket_sizes", data["bucket_sizes"]),
        data["has_rebuilt_buckets"],
    )


def _sizes(text: str | list[int]) -> list[int]:
    return sorted(int(x) for x in text.split(", ")) if isinstance(text, str) else sorted(text)


def test_fixed_buckets_put_each_parameter_alone_before_and_after_the_rebuild() -> None:
    """A bucket per parameter tensor in both layouts. With ``bucket_cap_mb_list=[0]`` torch
    2.11's DDP raised "bucket_cap_mb should be set by now" at construction."""
    from ddp_lab.tools.train import SmallCNN

    assert train_process.fixed_buckets() == {"bucket_cap_mb_list": [train_process.ONE_BYTE_MB]}
    built, rebuilt, _ = dl.spawn(_buckets, nprocs=1, backend="gloo", quiet=True)[0]
    params = sorted(p.numel() * p.element_size() for p in SmallCNN().parameters())
    assert _sizes(built) == params
    assert _sizes(rebuilt) == params


def test_fixed_buckets_on_a_ddp_without_bucket_cap_mb_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An older DDP: find_unused_parameters, and no Python filter pretending to hide torch's
    C++ warning about it."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    class OlderDDP(DDP):
        def __init__(self, module: nn.Module, find_unused_parameters: bool = False) -> None:
            super().__init__(module, find_unused_parameters=find_unused_parameters)

    assert "bucket_cap_mb_list" not in inspect.signature(OlderDDP).parameters
    monkeypatch.setattr(train_process, "DDP", OlderDDP)
    with warnings.catch_warnings():
        before = list(warnings.filters)
        assert train_process.fixed_buckets() == {"find_unused_parameters": True}
        assert warnings.filters == before


def _bound_socket() -> tuple[int, int]:
    """A listening socket on a port the kernel picked, as the zygote makes for rank 0."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    return sock.detach(), port


def test_rank_0_serves_the_store_on_the_inherited_socket() -> None:
    """This torch's TCPStore takes ``master_listen_fd`` (2.11 and 2.13): a client on the port
    reaches rank 0's store."""
    from datetime import timedelta

    import torch.distributed as dist

    from ddp_lab.runtime import _rank

    fd, port = _bound_socket()
    _rank.host_store(0, {"store_fd": fd, "port": port})
    try:
        assert len(_rank._HOSTED_STORE) == 1
        client = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10))
        client.set("k", "v")
        assert _rank._HOSTED_STORE[0].get("k") == b"v"
    finally:
        _rank._HOSTED_STORE.clear()


def test_a_torch_without_master_listen_fd_leaves_the_port_to_init_process_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 closes the inherited socket, so the store ``init_process_group`` makes can bind
    the port itself."""
    from datetime import timedelta

    import torch.distributed as dist

    from ddp_lab.runtime import _rank

    real = dist.TCPStore

    def older(*args: object, master_listen_fd: int | None = None, **kwargs: object) -> None:
        raise TypeError("__init__(): incompatible constructor arguments")  # pybind11's words

    fd, port = _bound_socket()
    monkeypatch.setattr(dist, "TCPStore", older)
    _rank.host_store(0, {"store_fd": fd, "port": port})
    assert _rank._HOSTED_STORE == []
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
    server = real("127.0.0.1", port, 1, True, timedelta(seconds=10))  # the port is free again
    server.set("k", "v")
    assert server.get("k") == b"v"


def _schema(op: str) -> list[str]:
    """The argument names of ``c10d::op`` in this torch's dispatcher."""
    (schema,) = torch._C._jit_get_schemas_for_operator(f"c10d::{op}")
    return [a.name for a in schema.arguments]


def test_the_c10d_operators_the_graders_watch_take_their_arguments_where_they_look() -> None:
    """``comm_debug.watch_c10d`` (the checkers of 05.ring, 07.bucketed, 10.bf16_hook,
    10.fsdp_reduce) names operators by ``C10D_NAMES`` and reads the payload from the first
    argument (``_FIRST_IS_PAYLOAD``) or the second (none for a barrier); ch05 reads a send's or receive's peer from
    the third. Checked against the schemas of this torch (the same in 2.11 and 2.13), so a
    torch that renames an operator or moves an argument fails here, not in a learner's grade."""
    import torch.distributed  # noqa: F401  (registers the c10d operators)

    from ddp_lab.comm_debug import _FIRST_IS_PAYLOAD, C10D_NAMES

    ops = {
        n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("c10d::")
    }
    assert set(C10D_NAMES) <= ops
    # every collective or p2p operator of this torch has a name a learner writes
    assert ops - set(C10D_NAMES) <= {"check_for_nan"}  # 2.13's NaN check: no payload
    for op in C10D_NAMES:
        args = _schema(op)
        if "barrier" in op:  # no payload: watch_c10d logs none
            assert args[:2] == ["tensor", "process_group"], (op, args)
            continue
        assert args[1 if op in _FIRST_IS_PAYLOAD else 2] == "process_group", (op, args)
    assert _schema("send")[2:4] == ["dst", "tag"]
    assert _schema("recv_")[2:4] == ["src", "tag"]
    assert _schema("allreduce_")[0] == "tensors"


def test_torch_save_opens_a_path_through_the_writer_class_it_looks_up_at_each_save(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike
) -> None:
    """08.fit counts ``torch.save`` of an ASCII path (C++ opens the file: no audit event) by
    replacing ``torch._C.PyTorchFileWriter`` with a subclass (``checks/ch08_writes.py``);
    that works while ``torch.serialization`` reads the attribute at each save (2.11, 2.13)."""
    seen = []
    real = torch._C.PyTorchFileWriter

    class Writer(real):  # type: ignore[misc, valid-type]
        def __init__(self, target: object, *args: object, **kwargs: object) -> None:
            seen.append(target)
            super().__init__(target, *args, **kwargs)

    monkeypatch.setattr(torch._C, "PyTorchFileWriter", Writer)
    path = os.path.join(tmp_path, "ckpt.pt")
    torch.serialization.save({"w": torch.ones(3)}, path)
    assert seen == [path]
    assert torch.equal(torch.load(path)["w"], torch.ones(3))
