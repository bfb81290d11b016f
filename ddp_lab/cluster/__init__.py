"""The lab's own cluster builders (chapter 09): hosts and Slurm on one machine.

- ``hosts``: hosts from network namespaces on a bridge (``ddp-lab hosts up/down``);
- ``slurm``: Slurm on those hosts (munged, slurmctld, one slurmd per host) and the sbatch
  scripts chapter 09 runs (``ddp-lab slurm up/status/down``).

The chapter's demos that use them (``ddp_lab.labs.two_hosts``, ``ddp_lab.labs.slurm_jobs``) stay at the
top of the package; ``ddp_lab.hosts`` and ``ddp_lab.slurm`` are old paths of these modules
(``ddp_lab/_moved.py``).
"""

import json
import os
from pathlib import Path

# Set to "1" (every language) or to languages ("zh", "en,zh"): the labs of chapters 04, 09, 11 show
# their stored runs in those languages instead of building hosts or Slurm. A quick read for a learner
# who has root; test.sh sets "1": the lessons show the stored runs, and tests/cluster (which unsets
# it, tests/conftest.py) runs each lab live once, with the assertions the chapters rely on.
STORED_RUNS = "DDP_LAB_STORED_RUNS"


def stored_runs_asked() -> bool:
    """Whether ``DDP_LAB_STORED_RUNS`` asks for the stored runs in the current language."""
    from ddp_lab.i18n import get_language

    wanted = {w.strip() for w in os.environ.get(STORED_RUNS, "").split(",") if w.strip()}
    return bool(wanted & {"1", "all", get_language()})


def lab_reason(unavailable: str | None) -> str | None:
    """Why a lab shows its stored run: ``DDP_LAB_STORED_RUNS`` asked, or ``unavailable``."""
    if stored_runs_asked():
        return f"{STORED_RUNS}={os.environ[STORED_RUNS]}"
    return unavailable


# The checkout a record was made in: its absolute path says where the recorder happened to work,
# not what a learner's run shows, so stored runs name files relative to the checkout
# (".venv/lib/python3.11/site-packages/torch/...").
_CHECKOUT = str(Path(__file__).resolve().parents[2]) + "/"


def store_record(path: Path, data: dict) -> None:
    """Write a stored real run as JSON, with paths inside this checkout made relative to it."""
    text = json.dumps(data, indent=1, ensure_ascii=False).replace(_CHECKOUT, "")
    path.write_text(text + "\n")


def load_record(path: Path, reason: str, slurm: bool = False) -> dict:
    """A stored real run, after saying why it is shown instead of a live one (``reason``)."""
    from ddp_lab.i18n import _t

    stored = json.loads(path.read_text())
    if stored_runs_asked():
        print(_t(
"{variable} is set: showing the stored output of a real run on {date} instead of a live one: "
"{command}"
, variable=f"{STORED_RUNS}={os.environ[STORED_RUNS]}", date=stored["date"], command=stored["command"]))  # fmt: skip
        return stored
    # The reason is a sentence of its own ("... as root."), put in parentheses before a full
    # stop: without its own stop, so that the notice does not end in ".)." (or its zh form).
    reason = reason.strip().rstrip("." + chr(0x3002))  # a full stop, ASCII or ideographic
    fields = {"reason": reason, "date": stored["date"], "command": stored["command"]}
    if slurm:
        print(_t(
"A Slurm cluster cannot be built here ({reason}). Showing the stored "
"output of a real run on {date}: {command}"
, **fields))  # fmt: skip
    else:
        print(_t(
"Hosts cannot be built here ({reason}). Showing the stored output of a "
"real run on {date}: {command}"
, **fields))  # fmt: skip
    return stored
