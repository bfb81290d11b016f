"""Shared fixtures: process-tree and port inspection for leak checks."""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

_PRIVATE_TMP: list[str] = []


def private_tmp() -> str:
    """TMPDIR for the commands the tests start themselves (torchrun makes a folder of logs in
    TMPDIR per run and never removes it): one folder, made on first use, removed at the end.

    Made on first use, not at import: rank processes import the test modules (and so this
    one) to unpickle the tests' functions, and end with ``os._exit`` (no atexit)."""
    if not _PRIVATE_TMP:
        _PRIVATE_TMP.append(tempfile.mkdtemp(prefix="ddp_lab_tests_"))
        atexit.register(shutil.rmtree, _PRIVATE_TMP[0], ignore_errors=True)
    return _PRIVATE_TMP[0]


def descendants(pid: int, zombies: bool = False) -> set[int]:
    """Every live process below ``pid`` (read from /proc, no psutil needed); with ``zombies``
    the zombies too (a zombie leader's other threads may still run and hold its sockets)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if fields[0] == "Z" and not zombies:  # gone already, just not reaped
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _fd_links(table: Path) -> list[str]:
    """What the fds in ``table`` (a /proc fd folder) point to."""
    try:
        fds = list(table.iterdir())
    except OSError:  # the process is gone
        return []
    links = []
    for fd in fds:
        try:
            links.append(os.readlink(fd))
        except OSError:  # closed while we read
            pass
    return links


def socket_inodes(pids: set[int]) -> set[int]:
    """Inodes of the sockets the processes ``pids`` hold."""
    inodes: set[int] = set()
    for pid in pids:
        links = _fd_links(Path(f"/proc/{pid}/fd"))
        if not links:  # a zombie leader: its fd table lives on in its other threads
            links = [x for t in Path(f"/proc/{pid}/task").glob("*/fd") for x in _fd_links(t)]
        inodes.update(int(x[8:-1]) for x in links if x.startswith("socket:["))
    return inodes


def our_socket_inodes() -> set[int]:
    """Inodes of the sockets this process and every process below it hold, zombies included."""
    return socket_inodes({os.getpid()} | descendants(os.getpid(), zombies=True))


def tcp_states(port: int, inodes: set[int] | None = None) -> list[str]:
    """TCP states (hex codes, 0A = LISTEN, 01 = ESTABLISHED) of our sockets on local ``port``.

    Ours: held by this process or one below it (``inodes`` when given, else read now). The
    port number alone says nothing about whose socket it is: once a launch let go of its port,
    the kernel may hand that number to anyone's bind(0) or connect(), and test.sh runs four
    pytest runs side by side, each launching ranks (a CI run failed on another run's socket).
    """
    if inodes is None:
        inodes = our_socket_inodes()
    states = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if int(parts[1].rsplit(":", 1)[1], 16) == port and int(parts[9]) in inodes:
                states.append(parts[3])
    return states


def ports_in_use(ports: set[int]) -> list[int]:
    """The ``ports`` on which a socket of ours listens or is connected (TIME_WAIT, the
    kernel's bookkeeping, is neither)."""
    inodes = our_socket_inodes()
    return sorted(p for p in ports if {"0A", "01"} & set(tcp_states(p, inodes)))


def process_group_of(pid: int) -> int | None:
    """The process group id of ``pid`` (None when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2 :].split()[2])


def rank_processes() -> set[int]:
    """Rank processes (and anything they started) still alive below the launcher's zygote.

    The zygote's preloading successor (``ddp_lab.runtime._zygote``) is below it too, but in
    the zygote's process group; every rank leads a group of its own.
    """
    from ddp_lab.runtime import launcher

    if launcher._zygote is None:
        return set()
    root = launcher._zygote.proc.pid
    return {p for p in descendants(root) if process_group_of(p) not in (root, None)}


# The grader's folder shared by 08.fit's ranks (course/grading/ranknet.make_share): a
# sandboxed 08.fit grading that another pytest run of test.sh has under way (phase 2 runs
# four side by side) keeps one for the seconds of its case; removed by RankPool._run.
GRADING_SHARE = "ddp-lab-share-"


def shm_files() -> set[str]:
    """The names in /dev/shm now (but the grader's shared folders: not the launcher's)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {n for n in os.listdir("/dev/shm") if not n.startswith(GRADING_SHARE)}


def shm_holders(names: set[str]) -> dict[str, set[int]]:
    """The processes that map or hold open each of ``names`` (files in /dev/shm).

    Matched by inode, not by path: glibc's sem_open maps a temporary file and then links it
    to the semaphore's name, so a process's maps name the (deleted) temporary file."""
    keys: dict[tuple[int, int, int], str] = {}
    for n in names:
        try:
            st = os.stat(f"/dev/shm/{n}")
        except OSError:  # gone meanwhile
            continue
        keys[(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)] = n
    holders: dict[str, set[int]] = {n: set() for n in names}
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        try:
            maps = (proc / "maps").read_text()
        except OSError:  # gone, or not ours to read
            maps = ""
        for line in maps.splitlines():
            parts = line.split(None, 5)
            if len(parts) < 5 or ":" not in parts[3]:
                continue
            major, minor = (int(x, 16) for x in parts[3].split(":"))
            name = keys.get((major, minor, int(parts[4])))
            if name is not None:
                holders[name].add(pid)
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            fds = []
        for fd in fds:
            try:
                st = os.stat(fd)
            except OSError:  # closed while we read
                continue
            name = keys.get((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
            if name is not None:
                holders[name].add(pid)
    return holders


def shm_left(before: set[str], patience: float = 5.0) -> set[str]:
    """Files in /dev/shm that were not in ``before`` and are still there after ``patience`` s,
    but those that only processes outside this test run hold.

    A leak stays. A file that goes within a few seconds is another program's at work (a
    multiprocessing semaphore lives in /dev/shm between sem_open and sem_unlink), not a leak.
    So is one that a process outside this pytest process's tree maps or holds, and none inside
    it: test.sh runs four pytest runs side by side, and a lesson's `spawn` multiprocessing
    Queue (three semaphores: ddp_lab/labs/shared_memory.py) in another run lives for as long
    as its lab runs (a CI run failed on one). A file that no process holds is counted: a
    launch that forgot to unlink leaves exactly that.
    """
    import time

    deadline = time.monotonic() + patience
    while (shm_files() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = shm_files() - before
    if not left:
        return left
    ours = {os.getpid()} | descendants(os.getpid(), zombies=True)
    holders = shm_holders(left)
    return {n for n in left if not holders[n] or holders[n] & ours}


@pytest.fixture
def no_leaks():
    """Assert a test leaves no rank processes and no new files in /dev/shm."""
    shm_before = shm_files()
    yield
    import time

    deadline = time.monotonic() + 5
    while rank_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rank_processes() == set()
    assert shm_left(shm_before) == set()
    # The launches' folders of rank files and traces (ddp_lab/runtime/_workdirs.py).
    pid = os.getpid()
    left = [
        p for k in ("", "trace_") for p in Path(tempfile.gettempdir()).glob(f"ddp_lab_{k}{pid}_*")
    ]
    assert left == []


@pytest.fixture
def checker_folders(monkeypatch):
    """Record the names of the temporary folders a checker module draws with ``uuid.uuid4``.

    A test that checks a checker removed its folders looks for these names only: other
    test runs on the same machine (test.sh runs three side by side) make folders with the
    same prefix at the same time, so a glob of the prefix would see theirs.
    """

    def record(module: str) -> list[str]:
        checker = importlib.import_module(f"ddp_lab.course.grading.checks.{module}")
        made: list[str] = []
        real = uuid.uuid4

        def uuid4() -> uuid.UUID:
            value = real()
            made.append(f"ddp_lab_{module}_{value.hex}")
            return value

        monkeypatch.setattr(checker.uuid, "uuid4", uuid4)
        return made

    return record


@pytest.fixture(autouse=True)
def _close_figures():
    """Close the figures a test drew, so that later tests do not pile them up."""
    yield
    import sys

    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


_CLUSTER_TESTS = Path(__file__).parent / "cluster"


@pytest.fixture(autouse=True)
def _cluster_labs_run_live(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/cluster runs every cluster lab live, whatever ``DDP_LAB_STORED_RUNS`` says.

    test.sh sets ``DDP_LAB_STORED_RUNS=1`` for the lessons: their cluster labs print the stored
    runs, and tests/cluster is where those labs run for real (hosts in namespaces, Slurm, the
    elastic and preemption runs), once per CI run. A test there that wants the stored runs sets
    the variable itself (``monkeypatch.setenv``). (Not a conftest.py of its own: tests import
    this one as ``conftest``.)
    """
    if _CLUSTER_TESTS in Path(str(request.node.path)).parents:
        from ddp_lab.cluster import STORED_RUNS

        monkeypatch.delenv(STORED_RUNS, raising=False)


# --- the grading tests' shared classes (tests/course/graded_classes.py) -----------------------
# Here, not in a tests/course/conftest.py: tests import this module as ``conftest``.


@pytest.fixture(scope="session")
def chapter00_class(tmp_path_factory: pytest.TempPathFactory):
    """The chapter-00 class of the grading tests, graded once (tests/course/graded_classes.py)."""
    from graded_classes import grade_chapter00

    return grade_chapter00(tmp_path_factory.mktemp("chapter00_class"))


@pytest.fixture(scope="session")
def chapter05_class(tmp_path_factory: pytest.TempPathFactory):
    """The chapter-05 class of the grading tests, graded once (tests/course/graded_classes.py)."""
    from graded_classes import grade_chapter05

    return grade_chapter05(tmp_path_factory.mktemp("chapter05_class"))


def pytest_configure(config: pytest.Config) -> None:
    """Make the test run interruptible, as a terminal's is, however it was started.

    A shell's background job without job control (``bash test.sh &`` in a script, ``nohup``)
    starts pytest with SIGINT ignored, and Python keeps an inherited SIG_IGN, as do the
    processes the tests start: the tests of what an interrupt does (tests/runtime) then wait
    for their timeouts. A hook, not import-time code: rank processes import this module too,
    and a rank ignores SIGINT while it waits (runtime/_rank_loop.py)."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # No deadline for Hypothesis's examples (its default: 200 ms each, a timed test; speed goals
    # go in benchmarks/). The first example of a process pays torch's first operation:
    # test_default_sizes_are_torch_chunk, the unit run's first test, took 624 ms there beside
    # another run, and failed as "unreliable" (its rerun took 0.05 ms).
    from hypothesis import settings

    settings.register_profile("ddp_lab", deadline=None)
    settings.load_profile("ddp_lab")


@pytest.fixture(scope="session", autouse=True)
def _hypothesis_charmap() -> None:
    """Build Hypothesis's Unicode tables now, not inside the first test's draw.

    Why: the first ``st.text()`` draw of a process builds the table of what UTF-8 encodes
    (1.3 s here) and the first ``st.characters()`` draw the Unicode categories (0.1-0.3 s),
    and Hypothesis counts both into the test's data generation. Both are kept under
    ``.hypothesis/``, per Unicode version (so per Python), which a fresh clone lacks: there the
    first test to draw text, ``test_records_read_back_what_workers_wrote`` in a run of the unit
    tests alone, failed its ``too_slow`` health check ("only generated 1 valid inputs after
    1.32 seconds"); test.sh's grading tests, which run first, had hidden it. A fixture, not
    ``pytest_configure``: Hypothesis warns about its storage read while plugins load. Internal
    functions: where a Hypothesis lacks them, nothing is built early."""
    try:
        from hypothesis.internal.charmap import charmap, intervals_from_codec
    except ImportError:
        return
    charmap()
    intervals_from_codec("utf-8")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` are skipped, with the reason, where torch sees no CUDA GPU.

    The first test that asks for ``chapter00_class`` grades it in its set-up, for all of them:
    the class holds the work of seven tests that had 600 s each (pyproject.toml); its tests
    get three times that (the class takes about 380 s on an idle 2-core machine)."""
    for item in items:
        if "chapter00_class" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(1800))
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return
    reason = pytest.mark.skip(
        reason=f"needs a CUDA GPU: torch {torch.__version__} sees none "
        f"(CUDA build: {torch.version.cuda or 'no'}); benchmarks/gpu_check.sh runs these"
    )
    for item in marked:
        item.add_marker(reason)
