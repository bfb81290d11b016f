"""An exercise's demo cell on a stub says "not solved yet" instead of stopping Run All.

The build replaces each solution block with ``raise NotImplementedError("your code here")``
(``course.build.stub_solutions``). A demo cell below it that calls the stub would raise, and
JupyterLab's Run All would stop there, before the graded cell. ``install`` adds an IPython
AST transformer that wraps each cell as::

    try:
        <the cell's statements but the last>
        _ddp_lab_value = <its last expression>      # or the last statement itself
    except NotImplementedError as exc:
        if not is_stub(exc):
            raise                                   # any other one goes on as it was
        _ddp_lab_value = not_solved(exc)           # prints the note
    _ddp_lab_value                                  # displayed as the cell's value

``%%ddp`` does the same for its ranks (``runtime.magic``). Graded cells still fail: ``dl.grade``
catches the stub's error itself and reports it as a failed verdict.
"""

from __future__ import annotations

import ast
from typing import Any

from ddp_lab.i18n import _t

VALUE = "_ddp_lab_value"


def stub_messages() -> set[str]:
    """The texts of the stubs' NotImplementedError, in every language."""
    return {_t("your code here", lang) for lang in ("en", "zh")}


def is_stub(exc: BaseException) -> bool:
    """Whether ``exc`` is an exercise stub's NotImplementedError."""
    return isinstance(exc, NotImplementedError) and str(exc) in stub_messages()


def note() -> str:
    return _t(
        "Not solved yet: this cell calls a function that still raises NotImplementedError. "
        "Replace the stub above with your code, then run this cell again."
    )


def not_solved(exc: BaseException) -> None:
    """Print the "not solved yet" note for a stub's error; re-raise any other exception."""
    if not is_stub(exc):
        raise exc
    print(note())


class _Wrap(ast.NodeTransformer):
    def visit_Module(self, node: ast.Module) -> ast.Module:
        body = node.body
        if not body or any(
            isinstance(s, ast.ImportFrom) and s.module == "__future__" for s in body
        ):
            return node
        last = body[-1]
        if isinstance(last, ast.Expr):
            inner = [*body[:-1], _assign(last.value)]
        else:
            inner = [*body, _assign(ast.Constant(None))]
        handler = ast.ExceptHandler(
            type=ast.Name("NotImplementedError", ast.Load()),
            name="_ddp_lab_exc",
            body=[
                # any other NotImplementedError goes on, with its own traceback
                ast.If(
                    test=ast.UnaryOp(ast.Not(), _call("is_stub")),
                    body=[ast.Raise(exc=None, cause=None)],
                    orelse=[],
                ),
                _assign(_call("not_solved")),
            ],
        )
        wrapped = ast.Try(body=inner, handlers=[handler], orelse=[], finalbody=[])
        tail = [ast.Expr(ast.Name(VALUE, ast.Load()))] if isinstance(last, ast.Expr) else []
        node.body = [wrapped, *tail]
        return ast.fix_missing_locations(ast.copy_location(node, node))


def _assign(value: ast.expr) -> ast.Assign:
    return ast.Assign(targets=[ast.Name(VALUE, ast.Store())], value=value, lineno=0)


def _call(name: str) -> ast.Call:
    # __import__ keeps the cell free of any name the learner might have rebound.
    func = ast.Attribute(
        ast.Call(
            ast.Name("__import__", ast.Load()),
            [ast.Constant("ddp_lab.course.unsolved")],
            [ast.keyword("fromlist", ast.List([ast.Constant("_")], ast.Load()))],
        ),
        name,
        ast.Load(),
    )
    return ast.Call(func, [ast.Name("_ddp_lab_exc", ast.Load())], [])


def install(shell: Any) -> None:
    """Add the transformer to ``shell`` (an IPython shell) once."""
    if shell is None or any(isinstance(t, _Wrap) for t in shell.ast_transformers):
        return
    shell.ast_transformers.append(_Wrap())
