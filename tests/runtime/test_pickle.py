"""ddp_lab.runtime._pickle: shipped functions keep their file name (cloudpickle >= 3.1.3 drops it)."""

from __future__ import annotations

import pickle

from ddp_lab.runtime import _pickle


def outer(x):
    def inner():
        return x

    return inner


def test_functions_and_nested_code_keep_their_file_name():
    back = pickle.loads(_pickle.dumps(outer))
    assert back.__code__.co_filename == outer.__code__.co_filename == __file__
    assert back(3).__code__.co_filename == __file__  # the nested function's code too
    assert back(3)() == 3


def test_a_lambda_defined_in_a_cell_keeps_the_cell_name():
    code = compile("f = lambda r: r + 1", "<ipython-input-7-abc>", "exec")
    ns: dict = {}
    exec(code, ns)
    back = pickle.loads(_pickle.dumps(ns["f"]))
    assert back.__code__.co_filename == "<ipython-input-7-abc>" and back(1) == 2
