"""Global rank, local rank, node and GPU of every process of a launch, as torchrun assigns them.

torchrun starts ``nproc_per_node`` workers on each node (agent). The rendezvous numbers the
nodes (``GROUP_RANK``); each worker gets ``LOCAL_RANK`` 0..n-1 on its node and the global
``RANK`` = (workers on the nodes numbered before its node) + ``LOCAL_RANK``. With the c10d
rendezvous the node numbers come from the rendezvous itself (``--node_rank`` is ignored);
with the static one (``--master_addr/--master_port``) they are the given ``--node_rank``.
A worker then uses ``cuda:LOCAL_RANK``, which is the LOCAL_RANK-th GPU that
``CUDA_VISIBLE_DEVICES`` leaves visible.

Teaching version: torchrun computes this in ``SimpleElasticAgent._assign_worker_ranks``;
``torchrun_assignment`` runs the real torchrun on localhost to check it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from ddp_lab.i18n import _t, get_language, pair


def _err(en: str, zh: str) -> ValueError:
    return ValueError(zh if get_language() == "zh" else en)


@dataclass(frozen=True)
class Proc:
    """One worker process of a launch."""

    rank: int
    local_rank: int
    node_rank: int
    world_size: int
    local_world_size: int
    device: str | None  # what the process passes to torch: "cuda:<local_rank>", None if invalid
    gpu: int | str | None  # the physical GPU on its node (index or UUID), None if none


def visible_gpus(cuda_visible_devices: str | None, gpus_on_node: int) -> list[int | str]:
    """The physical GPUs a process sees, in the order it numbers them (cuda:0, cuda:1, ...).

    CUDA's rule: a comma-separated list of indices (or ``GPU-...`` UUIDs); unset means all;
    the list stops at the first invalid entry (so "" and "-1" hide every GPU).
    """
    if cuda_visible_devices is None:
        return list(range(gpus_on_node))
    seen: list[int | str] = []
    for token in cuda_visible_devices.split(","):
        token = token.strip()
        if token.startswith(("GPU-", "MIG-")):
            seen.append(token)
        elif token.isdigit() and int(token) < gpus_on_node:
            seen.append(int(token))
        else:
            break  # CUDA ignores this entry and everything after it
    return seen


def _per_node(value: object, nnodes: int, what: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != nnodes:
            raise _err(
                *pair(
                    "{what} has {count} entries for {nnodes} nodes.",
                    what=what,
                    count=len(value),
                    nnodes=nnodes,
                )
            )
        return list(value)
    return [value] * nnodes


def assign(
    nproc_per_node: int | Sequence[int],
    nnodes: int | None = None,
    cuda_visible_devices: str | None | Sequence[str | None] = None,
    gpus_per_node: int = 8,
) -> list[Proc]:
    """Every process of a launch, in global rank order.

    Args:
        nproc_per_node: one number for all nodes, or one per node in node-rank order.
        nnodes: number of nodes (taken from the list when ``nproc_per_node`` is one).
        cuda_visible_devices: the value on every node, or one value per node (None: unset).
    """
    if nnodes is None:
        nnodes = len(nproc_per_node) if isinstance(nproc_per_node, (list, tuple)) else 1
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(_t("nnodes must be a whole number >= 1, got {nnodes!r}.", nnodes=nnodes))
    counts = _per_node(nproc_per_node, nnodes, "nproc_per_node")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
        raise ValueError(
            _t(
                "nproc_per_node must be whole numbers >= 1, got {nproc_per_node!r}.",
                nproc_per_node=nproc_per_node,
            )
        )
    cvds = _per_node(cuda_visible_devices, nnodes, "cuda_visible_devices")
    world = sum(counts)
    procs, base = [], 0
    for node, (n, cvd) in enumerate(zip(counts, cvds, strict=True)):
        gpus = visible_gpus(cvd, gpus_per_node)
        for local in range(n):
            ok = local < len(gpus)
            procs.append(
                Proc(
                    base + local,
                    local,
                    node,
                    world,
                    n,
                    f"cuda:{local}" if ok else None,
                    gpus[local] if ok else None,
                )
            )
        base += n
    return procs


_WORKER = """
import json, os
keys = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
        "CUDA_VISIBLE_DEVICES", "DDP_LAB_AGENT")
with open(os.path.join(os.environ["DDP_LAB_OUT"], os.environ["RANK"] + ".json"), "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
"""


def torchrun_assignment(
    nproc_per_node: Sequence[int],
    cuda_visible_devices: Sequence[str | None] | None = None,
    rdzv_backend: str = "c10d",
    timeout: float = 120,
) -> list[dict]:
    """Run real torchrun agents on localhost, one per simulated node; return what each worker saw.

    Each returned dict holds the worker's environment (RANK, LOCAL_RANK, GROUP_RANK,
    WORLD_SIZE, LOCAL_WORLD_SIZE, CUDA_VISIBLE_DEVICES) and ``agent``, the index of the
    torchrun command (0, 1, ...) it came from; the list is in global rank order.
    """
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    nnodes = len(nproc_per_node)
    cvds = list(cuda_visible_devices) if cuda_visible_devices is not None else [None] * nnodes
    from ddp_lab.runtime.launcher import free_port

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="ddp_lab_torchrun_") as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(_WORKER)
        agents = []
        for i, (n, cvd) in enumerate(zip(nproc_per_node, cvds, strict=True)):
            env = {
                k: v
                for k, v in os.environ.items()
                if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
            }
            # TMPDIR: torchrun's log folder goes in this one, removed after
            env.update(DDP_LAB_OUT=tmp, DDP_LAB_AGENT=str(i), OMP_NUM_THREADS="1", TMPDIR=tmp)
            env.pop("CUDA_VISIBLE_DEVICES", None)
            if cvd is not None:
                env["CUDA_VISIBLE_DEVICES"] = cvd
            if rdzv_backend == "c10d":
                rdzv = [
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}",
                    "--rdzv-id=ddp_lab",
                ]
            else:  # static: node ranks are the given --node_rank
                rdzv = ["--master_addr=127.0.0.1", f"--master_port={port}"]
            cmd = [
                torchrun,
                f"--nnodes={nnodes}",
                f"--node_rank={i}",
                f"--nproc_per_node={n}",
                "--monitor-interval=0.1",
                *rdzv,
                script,
            ]
            agents.append(
                subprocess.Popen(
                    cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
            )
        try:
            logs = [a.communicate(timeout=timeout)[0] for a in agents]
        finally:
            for a in agents:  # only our own agents, by handle
                if a.poll() is None:
                    a.kill()
                    a.wait()
        if any(a.returncode for a in agents):
            raise RuntimeError("torchrun failed:\n" + "\n".join(lg[-2000:] for lg in logs))
        out = []
        for name in sorted(os.listdir(tmp), key=lambda s: (len(s), s)):
            if name.endswith(".json"):
                with open(os.path.join(tmp, name)) as f:
                    raw = json.load(f)
                row = {
                    k: int(raw[k])
                    for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
                }
                row["CUDA_VISIBLE_DEVICES"] = raw["CUDA_VISIBLE_DEVICES"]
                row["agent"] = int(raw["DDP_LAB_AGENT"])
                out.append(row)
    return sorted(out, key=lambda r: r["RANK"])


def rank_table_widget(nnodes: int = 2, nproc_per_node: int = 4, gpus_per_node: int = 4):  # noqa: ANN201
    """Sliders for nnodes, nproc_per_node, GPUs per node and CUDA_VISIBLE_DEVICES; draws
    every process on its node and GPU (drawn from ``assign``) and lists them in a table."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import HTML, display

    style = {"description_width": "initial"}  # long labels are not cut to "nproc_per..."
    s_nodes = w.IntSlider(nnodes, 1, 4, description="nnodes", style=style)
    s_nproc = w.IntSlider(nproc_per_node, 1, 8, description="nproc_per_node", style=style)
    s_gpus = w.IntSlider(gpus_per_node, 1, 8, description=_t("GPUs/node"), style=style)
    t_cvd = w.Text(
        "",
        description="CUDA_VISIBLE_DEVICES",
        placeholder=_t("unset (e.g. 2,3)"),
        style=style,
    )
    out = w.Output()

    def redraw(*_: object) -> None:
        cvd = t_cvd.value.strip() or None
        procs = assign(s_nproc.value, s_nodes.value, cvd, s_gpus.value)
        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(8, 0.9 + 1.1 * s_nodes.value))
            for node in range(s_nodes.value):
                y = s_nodes.value - 1 - node
                shown = visible_gpus(cvd, s_gpus.value)
                for g in range(s_gpus.value):
                    ax.add_patch(
                        plt.Rectangle(
                            (g, y + 0.05),
                            0.9,
                            0.8,
                            fill=g in shown,
                            color="#cfe8cf" if g in shown else "#bbbbbb",
                        )
                    )
                    ax.text(g + 0.45, y + 0.75, f"GPU {g}", ha="center", fontsize=7)
                for p in (q for q in procs if q.node_rank == node):
                    x = p.gpu if isinstance(p.gpu, int) else s_gpus.value + p.local_rank * 0.5
                    ax.text(
                        x + 0.45 if isinstance(p.gpu, int) else x,
                        y + 0.35,
                        _t(
                            "rank {rank}\nlocal {local_rank}\n{device}",
                            rank=p.rank,
                            local_rank=p.local_rank,
                            device=p.device or _t("no GPU"),
                        ),
                        ha="center",
                        fontsize=7,
                        color="black" if p.device else "#c62828",
                    )
                ax.text(-0.2, y + 0.45, _t("node {node}", node=node), ha="right")
            ax.set_xlim(-1.3, s_gpus.value + 0.5 * s_nproc.value + 0.2)
            ax.set_ylim(0, s_nodes.value)
            ax.axis("off")
            ax.set_title(
                _t("grey: hidden by CUDA_VISIBLE_DEVICES; red: no GPU for this local rank"),
                fontsize=9,
            )
            plt.show()
            head = _t(
                "<tr><th>rank</th><th>local "
                "rank</th><th>node</th><th>device</th><th>physical GPU</th></tr>"
            )
            rows = "".join(
                f"<tr><td>{p.rank}</td><td>{p.local_rank}</td><td>{p.node_rank}</td>"
                f"<td>{p.device or '-'}</td><td>{'-' if p.gpu is None else p.gpu}"
                "</td></tr>"
                for p in procs
            )
            display(HTML(f"<table>{head}{rows}</table>"))

    for widget in (s_nodes, s_nproc, s_gpus, t_cvd):
        widget.observe(redraw, names="value")
    redraw()
    box = w.VBox([w.HBox([s_nodes, s_nproc]), w.HBox([s_gpus, t_cvd]), out])
    display(box)
    return box


def timed_in_processes(job: object, nprocs: int = 2) -> float:
    """Seconds that ``nprocs`` processes (``dl.spawn``) take to run ``job()`` side by side.

    Timed inside the ranks between two barriers, so the start of the processes (an
    interpreter, torch's import, the process group: about a second, and a different one each
    launch) is not in it. Subtracting a separately timed empty launch instead leaves that
    launch-to-launch difference in a job of a tenth of a second: on 2 cores it showed a
    speed-up above 2x.
    """
    from ddp_lab.runtime.launcher import spawn

    def one_rank(rank: int) -> float:
        import time

        import torch.distributed as dist

        dist.init_process_group("gloo")
        dist.barrier()  # every rank is up: the clock starts together
        start = time.perf_counter()
        job()  # type: ignore[operator]
        dist.barrier()  # until the slowest rank is done
        return time.perf_counter() - start

    return max(spawn(one_rank, nprocs=nprocs))
