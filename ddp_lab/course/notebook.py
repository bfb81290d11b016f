"""Notebook helpers: pick the notebook's language, Chinese fonts for plots, show source, a
scratch folder that goes away with the kernel.

``setup()`` is what a lesson's first code cell calls. The language is taken from, in
order: ``DDP_LAB_LANG``; the notebook's path (JupyterLab puts it in ``JPY_SESSION_NAME``);
the kernel's working directory (``notebooks/zh/...`` runs with cwd ``.../zh``).
"""

from __future__ import annotations

import inspect
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from ddp_lab import i18n

CJK_FONT_FILE = "NotoSansCJKsc-Regular.otf"
CJK_FONT_NAME = "Noto Sans CJK SC"


def detect_language() -> str:
    """The language of the running notebook, "en" when nothing says otherwise."""
    env = os.environ.get("DDP_LAB_LANG")
    if env and env[:2].lower() in i18n.LANGUAGES:
        return env[:2].lower()
    candidates = [os.environ.get("JPY_SESSION_NAME", ""), os.getcwd()]
    for path in candidates:
        parts = Path(path).parts
        for part in reversed(parts[:-1] if path.endswith(".ipynb") else parts):
            if part in i18n.LANGUAGES:
                return part
    return "en"


class _QuietRegularOnly(logging.Filter):
    """mplfonts ships the CJK font in its regular weight only, so bold text is drawn regular;
    matplotlib says so under every such figure ("findfont: Failed to find font weight bold
    for Noto Sans CJK SC"), a red line in the learner's output. Drop that line, nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            str(record.msg).startswith("findfont: Failed to find font weight")
            and CJK_FONT_NAME in map(str, record.args or ())
        )


def use_cjk_font() -> str | None:
    """Make matplotlib draw Chinese characters (the Noto CJK font shipped by mplfonts)."""
    import matplotlib
    from matplotlib import font_manager

    try:
        import mplfonts
    except ImportError:
        return None
    path = Path(mplfonts.__file__).parent / "fonts" / CJK_FONT_FILE
    if not path.exists():
        return None
    font_manager.fontManager.addfont(str(path))
    log = logging.getLogger("matplotlib.font_manager")
    if not any(isinstance(f, _QuietRegularOnly) for f in log.filters):
        log.addFilter(_QuietRegularOnly())
    sans = matplotlib.rcParams["font.sans-serif"]
    if CJK_FONT_NAME not in sans:
        matplotlib.rcParams["font.sans-serif"] = [CJK_FONT_NAME, *sans]
    matplotlib.rcParams["font.family"] = "sans-serif"
    matplotlib.rcParams["axes.unicode_minus"] = False  # the CJK font lacks U+2212
    return CJK_FONT_NAME


def setup(lang: str | None = None) -> str:
    """Set the message language for this notebook and fonts for its plots; return the language."""
    lang = lang or detect_language()
    i18n.set_language(lang)
    use_cjk_font()
    try:
        from IPython import get_ipython

        from ddp_lab.course import unsolved

        unsolved.install(get_ipython())  # a demo cell on a stub does not stop Run All
    except ImportError:
        pass
    return lang


def tr(en: str, zh: str) -> str:
    """Pick the text for the current language: for plot titles, labels and widget text."""
    return zh if i18n.get_language() == "zh" else en


def compare(got: Any, expected: Any) -> str:
    """ "right", or "WRONG: expected ..." for an exercise's demo cell: ``got`` against the answer
    the demo computed another way (tensors compared with ``torch.equal``). In the notebook's
    language, also on a rank (which finds it as ``setup`` does)."""
    lang = i18n.get_language() if i18n.get_language() != "en" else detect_language()
    try:
        import torch

        if isinstance(got, torch.Tensor) or isinstance(expected, torch.Tensor):
            same = torch.equal(torch.as_tensor(got), torch.as_tensor(expected))
            shown = expected.tolist() if isinstance(expected, torch.Tensor) else expected
        else:
            same, shown = got == expected, expected
    except (TypeError, RuntimeError):
        same, shown = False, expected
    if same:
        return i18n._t("right", lang)
    return i18n._t("WRONG: expected {expected}", lang, expected=shown)


def show_source(obj: Any) -> Any:
    """Display the source code of a ddp_lab function or class with syntax highlighting.

    In IPython (a notebook's kernel) the code is displayed at once and None is returned, so
    that it shows wherever the call sits in its cell: a returned object shows only as the
    cell's last expression, and a ``show_source`` followed by more code showed nothing.
    Elsewhere it returns the code (an ``IPython.display.Code``, or the text without IPython).
    """
    source = inspect.getsource(obj)
    try:
        from IPython import get_ipython
        from IPython.display import Code, display
    except ImportError:
        return source
    code = Code(source, language="python")
    if get_ipython() is None:
        return code
    display(code)
    return None


def scratch(name: str) -> Path:
    """A new private folder for a notebook's files (checkpoints, traces, copies of data),
    removed with everything in it when this Python process (the notebook's kernel) ends,
    however it ends. ``tempfile.mkdtemp`` alone would leave one behind per run."""
    folder = Path(tempfile.mkdtemp(prefix=f"ddp_lab_{name}_"))
    _remove_when_gone(folder)
    return folder


# Reads folder names, one per line, until its input ends (the process that started it is
# gone, whatever ended it), then removes them.
_REAPER = (
    "import shutil, sys\nfor f in list(sys.stdin):\n    shutil.rmtree(f[:-1], ignore_errors=True)\n"
)
_reaper: IO[str] | None = None


def _remove_when_gone(folder: Path) -> None:
    """Have a small process of its own remove ``folder`` once this process has ended, however
    it ended. Not atexit: a kernel that is killed runs none (nbval and jupyter_client's
    ``shutdown_kernel(now=True)`` send SIGKILL). The pipe's write end stays in this process
    only (not inherited by what it starts), so its end of file means this process is gone."""
    global _reaper
    if _reaper is None:
        read, write = os.pipe()
        subprocess.Popen(
            [sys.executable, "-c", _REAPER],
            stdin=read,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # survives a kill of the kernel's process group
        )
        os.close(read)
        _reaper = os.fdopen(write, "w", buffering=1)
    _reaper.write(f"{folder}\n")
